"""A search replayed against a measured table instead of live servers.

A tabular benchmark (``benchmarks/replay_search.py``): a grid of configs is
measured once, carefully (``benchmarks/replay_table.py``: several fresh
starts each, every request kept), and then searches are run against it many
times.  Only the measurement is replaced: ``stand_in`` answers each server
start ``qtune.measure.measure_server`` is asked for with a draw from that
config's measured runs, so the sampler, the start design, the engine's
space shaping, pruning and the top-K confirmation all run qtune's own code.

A draw is a whole measured run (one start, one set of prompts), so its noise
is the table's own.  A trial's pruner is fed that run's requests in the
order they finished, and stops it where it would have stopped the live run.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from unittest import mock

from qtune.bench import BenchConfig
from qtune.errors import InputError
from qtune.launch import LaunchSpec
from qtune.load import Watcher
from qtune.load.client import RequestSample
from qtune.measure import Measurement, replace_measure_server
from qtune.metrics import metric_value, summarize
from qtune.params import JSONObject, Params, ParamValue
from qtune.search.config import TuneConfig

if TYPE_CHECKING:
    from qtune.search.inputs import Prepared

TABLE_VERSION = 1
# How often the live load client lets the pruner look (qtune.load: "a few
# times a second"); at ~25 req/s about every 5 finished requests.
_WATCH_EVERY = 5


def config_key(params: Mapping[str, ParamValue], tuned: Sequence[str]) -> str:
    """A config's name in the table: its tuned values ("" for the engine
    defaults, which set none of them)."""
    return ",".join(f"{k}={params[k]}" for k in sorted(tuned) if k in params)


def sample_record(s: RequestSample, t0: float) -> JSONObject:
    """One request of a measured run as the table keeps it (times in s,
    ``start`` from the run's first send)."""
    return {"start": round(s.start - t0, 6), "ttft": s.ttft, "e2e": s.e2e,
            "prompt_tokens": s.prompt_tokens, "output_tokens": s.output_tokens,
            "error": s.error}


def _sample(r: Mapping[str, Any]) -> RequestSample:
    return RequestSample(start=r["start"], ttft=r["ttft"], e2e=r["e2e"],
                         prompt_tokens=r["prompt_tokens"], output_tokens=r["output_tokens"],
                         error=r["error"])


@dataclass
class Run:
    """One measured start of one config."""

    summary: dict[str, Any]
    samples: list[dict[str, Any]]
    startup_s: float
    measure_s: float


@dataclass
class Table:
    """Measured runs per config (keyed by ``config_key``)."""

    meta: dict[str, Any]
    runs: dict[str, list[Run]]
    params: dict[str, dict[str, Any]]  # key -> the full launch params

    @classmethod
    def load(cls, folder: Path) -> Table:
        """A table as ``benchmarks/replay_table.py`` writes it: ``meta.json``
        and ``runs.jsonl`` (runs that failed to start are left out)."""
        try:
            meta = json.loads((folder / "meta.json").read_text())
            lines = (folder / "runs.jsonl").read_text().splitlines()
        except (OSError, ValueError) as exc:
            raise InputError(f"no replay table in {folder}: {exc}",
                             hint="measure one with benchmarks/replay_table.py") from None
        if meta.get("version") != TABLE_VERSION:
            raise InputError(f"{folder}: table version {meta.get('version')}, "
                             f"this replay reads {TABLE_VERSION}",
                             hint="measure the table again")
        return cls.from_rows(meta, [json.loads(line) for line in lines if line.strip()])

    @classmethod
    def from_rows(cls, meta: JSONObject, rows: list[JSONObject]) -> Table:
        runs: dict[str, list[Run]] = {}
        params: dict[str, dict[str, Any]] = {}
        # The rows as benchmarks/replay_table.py writes them: read, not checked.
        written: list[dict[str, Any]] = rows
        for r in written:
            if "summary" not in r:
                continue
            key = config_key(r["params"], cast("list[str]", meta["tuned"]))
            params[key] = r["params"]
            runs.setdefault(key, []).append(
                Run(r["summary"], r["samples"], r["startup_s"], r["measure_s"]))
        return cls(meta, runs, params)

    def value(self, run: Run) -> float:
        v = metric_value(run.summary, self.meta["objective"])
        if v is None:
            raise InputError(f"a table run has no {self.meta['objective']}",
                             hint="measure the table again")
        return float(v)

    def true_value(self, key: str) -> float:
        """A config's quality as the table knows it: the median of its runs."""
        return statistics.median(self.value(r) for r in self.runs[key])

    def best(self) -> tuple[str, float]:
        sign = -1.0 if self.meta["direction"] == "maximize" else 1.0
        key = min(self.runs, key=lambda k: sign * self.true_value(k))
        return key, self.true_value(key)

    def gap(self, key: str) -> float:
        """How far a config is from the table's best, as a fraction (0: the
        best; 0.05: 5% worse, whichever the objective's direction)."""
        best = self.best()[1]
        v = self.true_value(key)
        return (best / v - 1.0) if self.meta["direction"] == "maximize" else (v / best - 1.0)

    def gain(self, key: str) -> float | None:
        """A config's true improvement over the engine defaults (their
        medians' ratio, >1: better), as a search's ``improvement`` states
        it; None when the table has no defaults."""
        if "" not in self.runs:
            return None
        d, v = self.true_value(""), self.true_value(key)
        return (v / d) if self.meta["direction"] == "maximize" else (d / v)


def measured_grid(params: Sequence[Mapping[str, ParamValue]],
                  dims: Sequence[str]) -> dict[str, list[int]]:
    """The largest product of the grid's two dimensions ``dims`` (outer,
    inner: as the table's ``space`` names them, e.g. vLLM's auto_tune.sh
    sweeps max_num_seqs x max_num_batched_tokens) whose every config was
    measured (a table cut short): the inner values of the best-covered
    outer value, and every outer value that has all of them.  The engine
    defaults set neither and are always in."""
    outer, inner = dims
    have: dict[int, set[int]] = {}
    for p in params:
        if outer in p:
            # a grid's dimensions are int params (max_num_seqs, max_num_batched_tokens)
            have.setdefault(cast(int, p[outer]), set()).add(cast(int, p[inner]))
    if not have:
        return {}
    widest = max(have.values(), key=len)
    return {outer: sorted(s for s, b in have.items() if b >= widest),
            inner: sorted(widest)}


def _spec_key(spec: LaunchSpec) -> tuple[Any, ...]:
    """What tells two launches apart, less the port every start picks."""
    argv = list(spec.argv)
    if "--port" in argv:
        i = argv.index("--port")
        del argv[i:i + 2]
    return tuple(argv), tuple(sorted(spec.env.items()))


@dataclass
class Launch:
    """One server start the stand-in answered."""

    key: str
    value: float | None  # the draw's objective (None: pruned)
    seconds: float  # the drawn run's start plus measurement


# A table config's launch: its params -> the engine's launch spec.
SpecOf = Callable[[Mapping[str, ParamValue]], LaunchSpec]


@dataclass
class StandIn:
    """Answers ``measure_server`` from ``table``: a launch spec is matched to
    the config whose launch command it is (``spec_of`` gives the spec of a
    table config), and a run of that config is drawn with ``rng``."""

    table: Table
    spec_of: SpecOf  # the engine's own launch_spec
    rng: random.Random
    launches: list[Launch] = field(default_factory=list)
    _by_spec: dict[tuple[Any, ...], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, params in self.table.params.items():
            self._by_spec[_spec_key(self.spec_of(params))] = key

    def key_of(self, spec: LaunchSpec) -> str:
        try:
            return self._by_spec[_spec_key(spec)]
        except KeyError:
            raise InputError("the search launched a config the table has not measured: "
                             + " ".join(spec.argv),
                             hint="the replay's space must be the table's") from None

    def measure(self, spec: LaunchSpec, *, watch: Watcher | None = None,
                on_ready: Callable[[float], None] | None = None,
                before: Callable[[], None] | None = None) -> Measurement:
        key = self.key_of(spec)
        run = self.rng.choice(self.table.runs[key])
        if on_ready is not None:
            on_ready(run.startup_s)
        if before is not None:
            before()
        out = self._replay(run, watch)
        out.startup_s = run.startup_s
        value = None if out.stopped_early else self.table.value(run)
        spent = run.startup_s + (out.measure_s or 0.0)
        self.launches.append(Launch(key, value, spent))
        return out

    def _replay(self, run: Run, watch: Any) -> Measurement:
        """The run as the search would have seen it: whole, or stopped where
        ``watch`` (the trial's pruner) stops it, looking at the requests
        finished and in flight as the live client shows them."""
        whole = Measurement.from_summary(run.summary)
        whole.measure_s = run.measure_s
        if watch is None:
            return whole
        samples = [_sample(r) for r in run.samples]
        ends = sorted(samples, key=lambda s: s.start + (s.e2e or 0.0))
        for i in range(_WATCH_EVERY - 1, len(ends), _WATCH_EVERY):
            now = ends[i].start + (ends[i].e2e or 0.0)
            done = ends[:i + 1]
            inflight = [s for s in ends[i + 1:] if s.start <= now]
            why = watch(done, inflight, now)
            if why is not None:
                summary = {**run.summary, **summarize(done, now), "stopped_early": why}
                out = Measurement.from_summary(summary)
                out.measure_s = now
                return out
        return whole


@contextlib.contextmanager
def standing_in(stand_in: StandIn) -> Iterator[StandIn]:
    """Every ``measure_server`` in this block is answered by ``stand_in``."""

    def answer(spec: LaunchSpec, log: Path, bench: BenchConfig, *,
               watch: Watcher | None = None,
               on_ready: Callable[[float], None] | None = None,
               before: Callable[[], None] | None = None,
               **_: object) -> Measurement:
        # (the rest of measure_server's keywords: for a live start only)
        return stand_in.measure(spec, watch=watch, on_ready=on_ready, before=before)

    with replace_measure_server(answer):
        yield stand_in


# -- searches against the table ------------------------------------------------

# qtune's methods run qtune's search (runner.run_study) with only the
# measurement replaced; "design" is TPE whose start design takes the whole
# budget (what the design alone finds); "tpe+confirm" is the default search
# as a user gets it (TuneConfig's confirm.top x confirm.repeats), the
# confirmation's launches counted in the budget; "tpe+cKxR" is TPE with the
# top K confirmed by R fresh starts each (the defaults with them).
QTUNE_METHODS = ("tpe", "tpe+confirm", "gp", "random", "design")
# vLLM's benchmarks/auto_tune/auto_tune.sh: every max_num_seqs, and within it
# every max_num_batched_tokens, in its lists' order, one start each; a rate
# step-down only when a latency limit is missed (the table has none), and
# the best measured throughput kept.
VLLM_AUTOTUNE = "vllm-autotune"
METHODS = (*QTUNE_METHODS, VLLM_AUTOTUNE)
_CONFIRM_RE = re.compile(r"tpe\+c(\d+)x(\d+)")


def confirmation_of(method: str) -> tuple[int, int] | None:
    """(top K, repeats R) of a confirming method, None for one that does not
    confirm; an unknown method is refused."""
    if method == "tpe+confirm":
        cfg = TuneConfig()
        return cfg.confirm.top, cfg.confirm.repeats
    if (m := _CONFIRM_RE.fullmatch(method)) and int(m[1]) > 0 and int(m[2]) > 0:
        return int(m[1]), int(m[2])
    if method in METHODS:
        return None
    raise InputError(f"unknown replay method {method!r}",
                     hint=", ".join(METHODS) + ", or tpe+cKxR (top K confirmed R times)")


def confirmed_trials(budget: int, top: int, repeats: int) -> int:
    """The most --trials whose confirmation (the top ``top`` and the
    defaults, ``repeats`` fresh starts each) still fits ``budget`` launches
    (0: none does)."""
    fits = [t for t in range(2, budget + 1)
            if t + min(top + 1, t) * repeats <= budget]
    return max(fits, default=0)


@dataclass
class Outcome:
    """One search against the table: the config it handed back, and every
    launch it made, in order."""

    method: str
    budget: int
    seed: int
    pick: str | None  # config key (None: no pick, or the budget is too small)
    gap: float | None  # the pick's true (table-median) gap to the table's best
    launches: list[Launch]
    # The improvement over the engine defaults the search states (its
    # profile's ``improvement``: the confirmation medians when both were
    # re-measured, else one run each), and the true one (table medians).
    claimed: float | None = None
    true_gain: float | None = None

    @property
    def claim_error(self) -> float | None:
        """How far the stated improvement is from the true one (0.1: it
        claims 10% more than there is; negative: it understates)."""
        if self.claimed is None or not self.true_gain:
            return None
        return self.claimed / self.true_gain - 1.0

    def reach(self, table: Table, within: float) -> tuple[int, float] | None:
        """Launches and seconds until the best measured so far (what the
        search would hand back then, without confirmation) was truly within
        ``within`` of the table's best."""
        sign = -1.0 if table.meta["direction"] == "maximize" else 1.0
        best: Launch | None = None
        spent = 0.0
        for i, la in enumerate(self.launches, 1):
            spent += la.seconds
            if la.value is not None and (best is None or best.value is None
                                         or sign * la.value < sign * best.value):
                best = la
            if best is not None and table.gap(best.key) <= within:
                return i, spent
        return None


def _spec_of(prep: Prepared) -> SpecOf:
    def spec_of(params: Mapping[str, ParamValue]) -> LaunchSpec:
        spec: LaunchSpec = prep.engine.launch_spec(params, prep.ctx, host="127.0.0.1",
                                                   port=0)
        return spec
    return spec_of


def replay_search(prep: Prepared, table: Table, method: str, budget: int, seed: int,
                  work: Path) -> Outcome:
    """Run ``method`` against ``table`` for ``budget`` launches with ``seed``
    (the sampler's seed and the draws': every method sees the same draws for
    a seed).  ``prep`` is a ``qtune.search.inputs.Prepared`` of the table's
    space and workload; the study's files go under ``work``."""
    import dataclasses

    from qtune.search import design, runner
    from qtune.search.reporter import NullReporter

    stand = StandIn(table, _spec_of(prep), random.Random(seed))
    confirm = confirmation_of(method)
    if method == VLLM_AUTOTUNE:
        return _autotune(prep, table, stand, budget, seed)
    top, repeats = confirm or (0, 1)
    trials = confirmed_trials(budget, top, repeats) if confirm else budget
    if trials < 2:
        return Outcome(method, budget, seed, None, None, [])
    cfg = dataclasses.replace(
        prep.cfg, seed=seed, trials=trials, time_budget=None,
        sampler="tpe" if confirm or method == "design" else method,
        confirm=dataclasses.replace(prep.cfg.confirm, top=top, repeats=repeats))
    name = f"{method.replace('+', '-')}-b{budget}-s{seed}"
    run_prep = dataclasses.replace(prep, cfg=cfg, study_name=name,
                                   storage_url=f"journal://{work / (name + '.log')}",
                                   study_dir=work / name)
    with contextlib.ExitStack() as stack:
        if method == "design":
            # The design takes every launch the budget leaves after the defaults.
            stack.enter_context(mock.patch.object(design, "startup_trials",
                                                  lambda t: max(t - 1, 1)))
        stack.enter_context(standing_in(stand))
        res = runner.run_study(run_prep, NullReporter())
    pick = config_key(res.best.params, table.meta["tuned"]) if res.best else None
    return Outcome(method, budget, seed, pick, table.gap(pick) if pick is not None else None,
                   stand.launches, claimed=res.improvement,
                   true_gain=table.gain(pick) if pick is not None else None)


def autotune_order(table: Table) -> list[Params]:
    """auto_tune.sh's launches: the table's first grid dimension outer
    (max_num_seqs), its second inner (max_num_batched_tokens), each list in
    the order given."""
    (outer, outer_values), (inner, inner_values) = table.meta["space"].items()
    fixed = table.meta["fixed"]
    return [{outer: s, inner: b, **fixed} for s in outer_values for b in inner_values]


def _autotune(prep: Prepared, table: Table, stand: StandIn, budget: int, seed: int) -> Outcome:
    spec_of = _spec_of(prep)
    sign = -1.0 if table.meta["direction"] == "maximize" else 1.0
    best: tuple[float, str] | None = None
    for params in autotune_order(table)[:budget]:
        stand.measure(spec_of(params))
        la = stand.launches[-1]
        assert la.value is not None  # no pruner: every run is whole
        if best is None or sign * la.value < sign * best[0]:
            best = (la.value, la.key)
    pick = best[1] if best else None
    # auto_tune.sh states no improvement: it never measures the defaults.
    return Outcome(VLLM_AUTOTUNE, budget, seed, pick,
                   table.gap(pick) if pick is not None else None, stand.launches,
                   true_gain=table.gain(pick) if pick is not None else None)
