#!/usr/bin/env python3
"""Search efficiency: qtune's TPE against a full grid and random search.

Runs ``qtune search`` as a user would (subprocesses, ``--json``), on the
embedded tiny model and the vLLM CPU build, with one fixed workload and one
small discrete space (a ``--space`` file of value lists):

  grid    ``--sampler grid``: every config once; the reference (its best,
          its size and its wall time).
  random  ``--sampler random``, ``--seeds`` seeds.
  tpe     ``--sampler tpe`` (qtune's default), the same seeds.

Budgets, in launches (qtune's ``--trials`` counts server launches, and every
run first launches the engine-defaults baseline):

- grid: ``--trials G+1`` (G launchable configs, plus the baseline);
- random and TPE: ``--trials ceil(G/4)+1`` each, per seed;
- ``--confirm-top 0`` everywhere, so no run re-measures anything.

The baseline is trial 0 of every "best so far" curve; k counts the tuned
launches after it.  Configs the memory estimate refuses (or vLLM would
refuse) are recorded without a launch and do not use up the budget.

Prints, per method, the median over seeds of the best objective after k
tuned launches and against wall time, next to the grid; the launches each
run needed to get within 5% of the grid's best; whether TPE beat random at
equal budget; the share of proposed configs the memory estimate skipped;
and the measurement time pruning saved (qtune's ``pruning.measure_s_saved``).
Everything printed comes from the runs; a run that fails is shown failed.

Why this workload (defaults; the flags change it):

- Closed loop, ``--concurrency 32``, not a request rate.  At a fixed rate, a
  config whose capacity lies near that rate flips between a steady queue and
  a growing one from run to run (noise far beyond 5%).  And qtune's
  ``--seed`` seeds both the sampler and the workload, so Poisson arrivals
  would differ between seeds; at a fixed concurrency a seed only changes
  the prompt texts (exact token lengths, ``ignore_eos``, random weights: the
  same work).  A closed loop keeps the server at its capacity all along.
- 256 prompt / 64 output tokens, 400 measured requests: ~15 s of
  measurement per trial at the ~27 req/s this reaches on 2 cores.  (A
  ``--quick`` run, 100 requests or ~4 s, saw the baseline spread 6.5% over
  its three runs: too close to the 5% being judged.)
- Objective ``e2e_p50``.  At a fixed concurrency, Little's law makes the
  median E2E about concurrency / throughput, which is what the two tuned
  parameters trade.  p99 on this VM is set by occasional ~0.7 s stalls: a
  stall delays the 32 requests then in flight, 8% of 400, which is the
  whole p99 but moves the median by only a few requests.

Why this space: ``max_num_seqs`` 4|8|16|32 (below, and at, the 32 streams:
how many requests wait) x ``max_num_batched_tokens`` 256|1024|4096|16384
(how many of the 256-token prefills of a wave share a step with the running
decodes) = 16 configs, all valid (every token budget >= every batch size).
Chunked prefill is fixed on (vLLM's default; off would make the small
budgets invalid) and prefix caching off (the prompts share no prefix).
``VLLM_CPU_KVCACHE_SPACE`` takes 2 GiB or, unless ``--no-oversized-kv``,
a size above the host's RAM: qtune's default CPU space caps the KV budget at
half the free memory, so without it the memory estimate would never fire
here.  Those configs double the proposals, not the launches.

Fallbacks for older qtune (the runs table says when one applied).  The
first run (``results/search-efficiency-20261130-024330``) found two grid bugs
that qtune has fixed since: the param-less baseline took the GridSampler's
grid point 0, which was then never run, and an exhausted grid called
``study.stop()`` outside ``Study.optimize`` (qtune exited 1, no ``--json``).
The script still reads every run's trials from its Optuna storage and runs
any launchable grid point the grid run missed as its own one-launch
``qtune search`` (all params fixed, ``--trials 1``), counted in the grid's
launches and wall time.  Per-trial timestamps come from the storage too
(``--json`` has none).  In that first run TPE also ran univariate (the
baseline's empty params emptied Optuna's joint space); qtune now builds a
multivariate TPE with ``group=True``.

    python benchmarks/search_efficiency.py            # ~40 min on 2 idle cores
    python benchmarks/search_efficiency.py --quick    # ~6 min smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import md_table, table, wait_until_alone  # noqa: E402

WITHIN = 0.05  # "within 5% of the grid's best"
SHARE = 4  # random and TPE get ceil(grid / SHARE) tuned launches
MAXIMIZE = {"throughput", "output_throughput", "goodput", "capacity"}
LAUNCHED = ("ok", "startup_failed", "load_failed", "pruned")  # as qtune counts launches
REPO = Path(__file__).resolve().parent.parent


# -- plan ---------------------------------------------------------------------
@dataclass
class Plan:
    seqs: list[int]
    mnbt: list[int]
    kv: int
    oversized_kv: int | None
    seeds: list[int]
    concurrency: int
    input_len: int
    output_len: int
    requests: int
    warmup: int
    objective: str
    trial_s: float

    @property
    def kv_values(self) -> list[int]:
        return [self.kv] + ([self.oversized_kv] if self.oversized_kv else [])

    def points(self) -> list[dict[str, int]]:
        return [{"max_num_seqs": s, "max_num_batched_tokens": b, "VLLM_CPU_KVCACHE_SPACE": k}
                for s in self.seqs for b in self.mnbt for k in self.kv_values]

    @property
    def launchable(self) -> int:
        return len(self.seqs) * len(self.mnbt)

    @property
    def budget(self) -> int:
        return math.ceil(self.launchable / SHARE)

    @property
    def maximize(self) -> bool:
        return self.objective in MAXIMIZE

    def space_yaml(self, point: dict[str, int] | None = None) -> str:
        lines = ["# written by benchmarks/search_efficiency.py"]
        if point is None:
            lines += [f"max_num_seqs: {self.seqs}", f"max_num_batched_tokens: {self.mnbt}",
                      f"VLLM_CPU_KVCACHE_SPACE: {self.kv_values}"]
        else:
            lines += [f"{k}: {v}" for k, v in point.items()]
        lines += ["enable_chunked_prefill: true", "enable_prefix_caching: false"]
        return "\n".join(lines) + "\n"

    def workload_args(self) -> list[str]:
        return ["--concurrency", str(self.concurrency), "--input-len", str(self.input_len),
                "--output-len", str(self.output_len), "--requests", str(self.requests),
                "--warmup", str(self.warmup), "--objective", self.objective]


def key(params: dict[str, Any]) -> tuple[Any, ...]:
    return (params.get("max_num_seqs"), params.get("max_num_batched_tokens"),
            params.get("VLLM_CPU_KVCACHE_SPACE"))


# -- one qtune run ------------------------------------------------------------
@dataclass
class Run:
    name: str
    method: str  # grid | grid-fill | random | tpe
    seed: int
    trials: int
    space: Path
    argv: list[str] = field(default_factory=list)
    rc: int | None = None
    started: float = 0.0  # epoch seconds
    wall_s: float = 0.0
    result: dict[str, Any] | None = None  # qtune's --json, when it printed one
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    foreign_cpu: float | None = None
    intruders: list[int] = field(default_factory=list)
    leftover: list[int] = field(default_factory=list)

    def launches(self) -> int:
        return sum(1 for r in self.rows if r["status"] in LAUNCHED)

    def summary(self) -> dict[str, Any]:
        # qtune's whole --json is in json/<run>.json; keep its run-level figures.
        res = self.result or {}
        return {k: getattr(self, k) for k in (
            "name", "method", "seed", "trials", "argv", "rc", "started", "wall_s", "error",
            "foreign_cpu", "intruders", "leftover")} | {
            "space": str(self.space), "qtune_printed_json": self.result is not None,
            "best_trial": (res.get("best") or {}).get("number")} | {
            k: res.get(k) for k in ("memory_estimate", "pruning", "stop_reason", "improvement")}


class Watch:
    """While one qtune run goes: vLLM servers that are not its descendants
    (another user's, which would share the 2 cores), its own servers (to
    check afterwards that none outlived it), and its CPU time.

    CPU is sampled per process (pid and start time) every second, because a
    server's engine core is not always reaped up the tree (its time then never
    reaches this process's RUSAGE_CHILDREN), and a process keeps being
    sampled after it is re-parented.  The last second of each is missed."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.own: set[int] = set()
        self.intruders: set[int] = set()
        self._procs: dict[tuple[int, float], Any] = {}
        self._cpu: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    def _sample(self) -> None:
        import psutil

        try:
            top = psutil.Process(self.root)
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                self._procs.setdefault((p.pid, p.create_time()), p)
            except psutil.Error:
                pass
        for k, p in self._procs.items():
            try:
                if p.is_running():  # False once the pid is gone or reused
                    t = p.cpu_times()
                    self._cpu[k] = t.user + t.system
            except psutil.Error:
                pass

    def _servers(self) -> None:
        import psutil

        res = subprocess.run(["pgrep", "-f", "vllm.entrypoints"], capture_output=True,
                             text=True)
        for pid in map(int, res.stdout.split()):
            try:
                ours = self.root in {p.pid for p in psutil.Process(pid).parents()}
            except psutil.Error:
                continue
            (self.own if ours else self.intruders).add(pid)

    def _poll(self) -> None:
        i = 0
        while not self._stop.wait(1.0):
            self._sample()
            if i % 2 == 0:
                self._servers()
            i += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the tree's last second, for what is still alive


def _busy_cpu() -> float:
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def _self_cpu() -> float:
    # This script only: qtune's tree is sampled (RUSAGE_CHILDREN would count
    # what was reaped twice).  The watcher's pgrep calls, a few ms every 2 s,
    # fall into "foreign".
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    """qtune stops its server on SIGINT/SIGTERM; SIGKILL is the last resort
    (its guard process then kills the server's group)."""
    for sig, grace in ((signal.SIGINT, 120), (signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue


def _end_leftovers(pids: set[int]) -> list[int]:
    """Our own vLLM processes still alive after qtune exited (should be none):
    end them by pid, and say so."""
    import psutil

    alive = []
    for pid in sorted(pids):
        try:
            p = psutil.Process(pid)
            if "vllm.entrypoints" in " ".join(p.cmdline()):
                alive.append(p)
        except psutil.Error:
            pass
    for p in alive:
        p.terminate()
    _, still = psutil.wait_procs(alive, timeout=15)
    for p in still:
        p.kill()
    return [p.pid for p in alive]


def run_qtune(run: Run, plan: Plan, out: Path, args: argparse.Namespace) -> None:
    storage = out / "studies" / f"{run.name}.log"
    run.argv = [sys.executable, "-m", "qtune", "search", "--json",
                "--sampler", "random" if run.method == "grid-fill" else run.method,
                "--seed", str(run.seed), "--trials", str(run.trials), "--confirm-top", "0",
                "--space", str(run.space), "--study", run.name,
                "--storage", f"journal://{storage}", *plan.workload_args()]
    if not args.no_wait:
        wait_until_alone(quiet=args.quiet)
    print(f"\n== {run.name}: {' '.join(run.argv[1:])}", flush=True)
    console = (out / "console" / f"{run.name}.txt").open("w")
    stdout = (out / "json" / f"{run.name}.json").open("wb")
    # cwd = the output folder: qtune writes studies/<study>/ (trial logs,
    # trials.csv) and profiles/ under the working directory.
    env = {**os.environ, "COLUMNS": "200"}
    busy0 = _busy_cpu()
    run.started = time.time()
    t0 = time.monotonic()
    # Own session: a Ctrl-C at the terminal reaches only this script, which
    # forwards one SIGINT and waits for qtune to stop its server.
    proc = subprocess.Popen(run.argv, cwd=out, stdout=stdout, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    self0 = _self_cpu()
    tail: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            console.write(line + "\n")
            console.flush()
            tail.append(line)
            del tail[:-20]
            if line.strip():
                print(f"  [{run.name}] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = t0 + run.trials * 600 + 600  # qtune's own start timeout is 600 s
    watch = Watch(proc.pid)
    watch.start()
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                run.error = "timed out: stopped by the benchmark"
                _stop_child(proc)
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        run.error = "interrupted"
        _stop_child(proc)
        raise
    finally:
        proc.wait()
        reader.join(timeout=10)
        run.wall_s = time.monotonic() - t0
        run.rc = proc.returncode
        watch.stop()
        console.close()
        stdout.close()
        own = watch.cpu_s + _self_cpu() - self0
        run.foreign_cpu = max(0.0, (_busy_cpu() - busy0) - own) / (
            max(run.wall_s, 1e-9) * (os.cpu_count() or 1))
        run.intruders = sorted(watch.intruders)
        run.leftover = _end_leftovers(watch.own)
        _collect(run, out, storage, tail)


def _collect(run: Run, out: Path, storage: Path, tail: list[str]) -> None:
    text = (out / "json" / f"{run.name}.json").read_text()
    try:
        run.result = json.loads(text) if text.strip() else None
    except ValueError:
        run.result = None
    if run.rc not in (0, 3) and run.error is None:
        # rc 3: qtune printed its result but no trial was feasible.
        msg = next((ln for ln in reversed(tail) if ln.strip()), "no output")
        run.error = f"qtune exited {run.rc}: {msg.strip()}"
        if "Study.stop" in msg:
            run.error += (" (qtune bug: Optuna's GridSampler.after_trial calls study.stop() "
                          "when the grid is used up, which raises outside Study.optimize; "
                          "the trials are all in the study)")
    if storage.is_file():
        try:
            run.rows = read_trials(storage, run.name, run.started)
        except Exception as exc:  # a broken journal is a failed run, not a crash here
            run.error = (run.error or "") + f"; cannot read the study: {exc}"


def read_trials(path: Path, study: str, started: float) -> list[dict[str, Any]]:
    """One row per trial, from the study's own storage: what --json holds,
    plus Optuna's trial times, the partial value of a pruned trial, the share
    of requests it left unsent, and the memory prediction."""
    import optuna
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.load_study(study_name=study,
                           storage=optuna.storages.JournalStorage(JournalFileBackend(str(path))))
    rows = []
    for t in st.get_trials(deepcopy=False):
        a = t.user_attrs
        cons = getattr(t, "constraints", None) or {}
        cons_vals = cons.values() if isinstance(cons, dict) else cons
        complete = t.state == TrialState.COMPLETE
        feasible = complete and all(v <= 0 for v in cons_vals)
        s = a.get("summary") or {}
        e2e = s.get("e2e_ms") or {}
        mem = a.get("memory_estimate") or {}
        partial = list(t.intermediate_values.values())

        def rel(d: dt.datetime | None) -> float | None:
            return None if d is None else round(d.timestamp() - started, 3)

        rows.append({
            "trial": t.number,
            "state": t.state.name,
            "status": a.get("status", f"no status ({t.state.name})"),
            "baseline": bool(a.get("baseline")),
            "reason": a.get("reason"),
            "detail": (a.get("detail") or "")[:300] or None,
            "params": a.get("launch_params", dict(t.params)),
            "value": t.value if feasible else None,
            "raw_value": t.value if complete else None,
            "feasible": feasible,
            "partial_value": partial[-1] if partial else None,
            "requests_unsent": a.get("requests_unsent"),
            "startup_s": a.get("startup_s"),
            "measure_s": a.get("measure_s"),
            "total_s": a.get("total_s"),
            "t_start_s": rel(t.datetime_start),
            "t_done_s": rel(t.datetime_complete),
            "memory_fits": mem.get("fits"),
            "memory_reason": mem.get("reason"),
            "e2e_p50_ms": e2e.get("p50"), "e2e_p90_ms": e2e.get("p90"),
            "e2e_p99_ms": e2e.get("p99"),
            "ttft_p50_ms": (s.get("ttft_ms") or {}).get("p50"),
            "tpot_p50_ms": (s.get("tpot_ms") or {}).get("p50"),
            "req_per_s": s.get("request_throughput"),
            "failed_requests": s.get("failed"),
        })
    return rows


# -- analysis -----------------------------------------------------------------
@dataclass
class Series:
    """One method at one seed: its runs' trials in order, with k (the
    launch index; 0 = the baseline) and t (seconds since its first run
    started, later runs added after the earlier ones' wall time)."""

    method: str
    seed: int
    runs: list[Run]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        k, off = -1, 0.0
        for run in self.runs:
            for r in run.rows:
                r = dict(r, run=run.name, method=self.method, seed=self.seed)
                # A fill run's single trial is qtune's baseline of that run, but
                # for the grid it is one of the grid's points.
                r["role"] = ("baseline" if r["baseline"] and run.method != "grid-fill"
                             else "tuned")
                r["k"] = (k := k + 1) if r["status"] in LAUNCHED else None
                r["t_s"] = None if r["t_done_s"] is None else round(r["t_done_s"] + off, 3)
                self.rows.append(r)
            off += run.wall_s

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.runs)

    @property
    def failed(self) -> list[str]:
        return [f"{r.name}: {r.error}" for r in self.runs if r.error]


def loss(v: float | None, maximize: bool) -> float:
    if v is None:
        return math.inf
    return -v if maximize else v


def unloss(x: float, maximize: bool) -> float | None:
    return None if math.isinf(x) else (-x if maximize else x)


def within(v: float | None, ref: float, maximize: bool) -> bool:
    if v is None:
        return False
    return v >= ref * (1 - WITHIN) if maximize else v <= ref * (1 + WITHIN)


def best_by_k(s: Series, maximize: bool, search_only: bool = False) -> list[float]:
    """Best loss after each launch k = 0.. (inf: nothing feasible yet).  With
    ``search_only`` the baseline's value is left out."""
    cur, out = math.inf, []
    for r in s.rows:
        if r["value"] is not None and not (search_only and r["role"] == "baseline"):
            cur = min(cur, loss(r["value"], maximize))
        if r["k"] is not None:
            out.append(cur)
    return out


def best_at(s: Series, t: float, maximize: bool) -> float:
    vals = [loss(r["value"], maximize) for r in s.rows
            if r["value"] is not None and r["t_s"] is not None and r["t_s"] <= t]
    return min(vals, default=math.inf)


def reached(s: Series, ref: float, maximize: bool, search_only: bool = False
            ) -> tuple[int | None, float | None]:
    """(launches k, seconds) at which the best first came within 5% of ref."""
    cur = math.inf
    for r in s.rows:
        if r["value"] is not None and not (search_only and r["role"] == "baseline"):
            cur = min(cur, loss(r["value"], maximize))
        if r["k"] is not None and within(unloss(cur, maximize), ref, maximize):
            return r["k"], r["t_s"]
    return None, None


def med(losses: list[float], maximize: bool) -> tuple[float | None, float | None, float | None]:
    """Median, min and max over seeds; a seed with nothing feasible yet counts
    as the worst, so a median that falls on one is shown as '-'."""
    if not losses:
        return None, None, None
    m = statistics.median(losses)
    finite = [x for x in losses if not math.isinf(x)]
    lo, hi = (min(finite), max(finite)) if finite else (math.inf, math.inf)
    if maximize:
        lo, hi = hi, lo
    return unloss(m, maximize), unloss(lo, maximize), unloss(hi, maximize)


def f1(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def cell(losses: list[float], n_all: int, maximize: bool) -> str:
    m, lo, hi = med(losses, maximize)
    if m is None:
        return "-"
    text = f1(m) if len(losses) == 1 else f"{f1(m)} [{f1(lo)}-{f1(hi)}]"
    return text + (f" (n={len(losses)})" if len(losses) < n_all else "")


def pct(v: float | None, ref: float) -> str:
    return "-" if v is None else f"{100 * (v / ref - 1):+.1f}%"


def analyse(plan: Plan, grid: Series | None, others: dict[str, list[Series]],
            out: Path) -> tuple[dict[str, Any], list[tuple[str, list[str], list[list[str]]]],
                                list[str]]:
    """The summary (JSON), the tables and the verdict lines."""
    mx = plan.maximize
    obj = plan.objective
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    lines: list[str] = []
    summary: dict[str, Any] = {"objective": obj, "direction": "maximize" if mx else "minimize",
                               "within": WITHIN, "budget": plan.budget}

    # Runs.
    all_series = ([grid] if grid else []) + [s for ss in others.values() for s in ss]
    run_rows = []
    for s in all_series:
        for r in s.runs:
            st = [x["status"] for x in r.rows]
            skipped = sum(1 for x in r.rows if x["reason"] == "predicted_oom")
            run_rows.append([
                r.name, r.method, str(r.seed), str(r.rc), str(r.launches()),
                str(skipped), str(st.count("invalid") - skipped), str(st.count("pruned")),
                str(st.count("startup_failed") + st.count("load_failed")),
                f"{r.wall_s:.0f}", "-" if r.foreign_cpu is None else f"{100 * r.foreign_cpu:.0f}%",
                "; ".join(filter(None, [
                    r.error, f"other vLLM servers ran: {r.intruders}" if r.intruders else "",
                    f"servers left running, ended: {r.leftover}" if r.leftover else ""])) or "",
            ])
    tables.append(("Runs (launches include the baseline; skipped = memory estimate, "
                   "no launch)", ["run", "sampler", "seed", "exit", "launches", "skipped",
                                  "invalid", "pruned", "failed starts", "wall s",
                                  "foreign CPU", "note"], run_rows))

    # Grid reference.
    ref = None
    if grid is not None:
        tuned = [r for r in grid.rows if r["role"] == "tuned"]
        best = min((r for r in tuned if r["value"] is not None),
                   key=lambda r: loss(r["value"], mx), default=None)
        covered = {key(r["params"]) for r in tuned}
        missing = [p for p in plan.points() if key(p) not in covered]
        dupes = len(tuned) - len(covered)
        launches = sum(1 for r in grid.rows if r["k"] is not None)
        ref = best["value"] if best else None
        summary["grid"] = {
            "best": ref, "best_params": best["params"] if best else None,
            "configs": plan.launchable, "points_incl_oversized_kv": len(plan.points()),
            "launches_incl_baseline": launches, "wall_s": round(grid.wall_s, 1),
            "not_covered": missing, "duplicates": dupes, "failed": grid.failed,
        }
        if ref is None:
            lines.append("GRID: no feasible grid config: no reference, no verdicts.")
        else:
            lines.append(
                f"Grid reference: best {obj} = {ref:.1f} ({_short(best['params'])}); "
                f"{plan.launchable} launchable configs, {launches} launches incl. the "
                f"baseline, wall {grid.wall_s / 60:.1f} min.")
        lost = [p for p in missing if p["VLLM_CPU_KVCACHE_SPACE"] != plan.oversized_kv]
        if lost:
            lines.append(f"GRID INCOMPLETE: {len(lost)} launchable point(s) never ran: "
                         + "; ".join(_short(p) for p in lost))
        if dupes:
            lines.append(f"grid: {dupes} config(s) ran twice (GridSampler re-evaluation)")
        # The landscape: one cell per launchable config.
        thr = math.inf
        by_key: dict[tuple[Any, ...], str] = {}
        for r in grid.rows:
            if r["role"] == "tuned":
                if r["value"] is not None:
                    txt = f1(r["value"])
                elif r["status"] == "pruned":
                    # The pruner stopped it once its percentile was sure to be
                    # worse than the best so far: that is a bound on its value.
                    b = unloss(thr, mx)
                    txt = f"pruned {'<' if mx else '>'}{f1(b)}" if b is not None else "pruned"
                elif r["reason"] == "predicted_oom":
                    txt = "skipped (memory)"
                else:
                    txt = f"{r['status']}: {r['reason']}"
                by_key[key(r["params"])] = txt
            thr = min(thr, loss(r["value"], mx))
        rows = [[str(s)] + [by_key.get((s, b, plan.kv), "not run") for b in plan.mnbt]
                for s in plan.seqs]
        tables.append((f"Grid: {obj} per config (VLLM_CPU_KVCACHE_SPACE={plan.kv}); rows "
                       "max_num_seqs, columns max_num_batched_tokens",
                       ["seqs \\ mnbt"] + [str(b) for b in plan.mnbt], rows))
        if plan.oversized_kv:
            big = [by_key.get((s, b, plan.oversized_kv), "not run")
                   for s in plan.seqs for b in plan.mnbt]
            rest = sorted(set(big) - {"skipped (memory)", "not run"})
            lines.append(
                f"grid, VLLM_CPU_KVCACHE_SPACE={plan.oversized_kv} (above RAM): "
                f"{big.count('skipped (memory)')} of {len(big)} skipped without a launch, "
                f"{big.count('not run')} not proposed before the grid run reached its launch "
                f"budget" + (f"; LAUNCHED ANYWAY: {rest}" if rest else ""))

    # Best so far against launches.
    n_seeds = len(plan.seeds)
    curves = {m: [best_by_k(s, mx) for s in ss] for m, ss in others.items()}
    grid_curve = best_by_k(grid, mx) if grid else []
    kmax = max([len(grid_curve) - 1] + [len(c) - 1 for cs in curves.values() for c in cs]
               + [0])
    rows = []
    for k in range(kmax + 1):
        row = [str(k), f1(unloss(grid_curve[k], mx)) if k < len(grid_curve) else ""]
        for m in others:
            vals = [c[k] for c in curves[m] if k < len(c)]
            row.append(cell(vals, n_seeds, mx) if vals else "")
        if ref is not None:
            row.append(pct(unloss(grid_curve[k], mx), ref) if k < len(grid_curve) else "")
            for m in others:
                v = med([c[k] for c in curves[m] if k < len(c)], mx)[0]
                row.append(pct(v, ref) if any(k < len(c) for c in curves[m]) else "")
        rows.append(row)
    heads = ["k", "grid"] + [f"{m} median [min-max]" for m in others]
    if ref is not None:
        heads += ["grid vs best"] + [f"{m} vs best" for m in others]
    tables.append((f"Best {obj} so far after k tuned launches (k=0: the engine-defaults "
                   f"baseline, trial 0 of every run; budget: grid {plan.launchable}, "
                   f"random/tpe {plan.budget}; median over {n_seeds} seed(s))", heads, rows))
    summary["best_by_k"] = {
        "grid": [unloss(x, mx) for x in grid_curve],
        **{m: {str(s.seed): [unloss(x, mx) for x in c] for s, c in zip(others[m], curves[m],
                                                                        strict=True)}
           for m in others}}

    # Best so far against wall time.
    t_end = max([grid.wall_s if grid else 0.0]
                + [s.wall_s for ss in others.values() for s in ss])
    step = 60.0 if t_end <= 3600 else 120.0
    rows, by_t = [], []
    t = step
    while t < t_end + step:
        row = [f"{t / 60:.0f}", f1(unloss(best_at(grid, t, mx), mx)) if grid else ""]
        point: dict[str, Any] = {"t_s": t, "grid": unloss(best_at(grid, t, mx), mx)
                                 if grid else None}
        for m, ss in others.items():
            vals = [best_at(s, t, mx) for s in ss]
            row.append(cell(vals, n_seeds, mx))
            point[m] = med(vals, mx)[0]
        rows.append(row)
        by_t.append(point)
        t += step
    tables.append((f"Best {obj} so far against wall time (from the start of each qtune "
                   "process; a finished run keeps its final best)",
                   ["minutes", "grid"] + [f"{m} median [min-max]" for m in others], rows))
    summary["best_by_wall_time"] = by_t
    summary["wall_s"] = {"grid": round(grid.wall_s, 1) if grid else None,
                         **{m: {str(s.seed): round(s.wall_s, 1) for s in ss}
                            for m, ss in others.items()}}

    # Launches needed to get within 5% of the grid's best.
    if ref is not None:
        rows, reach = [], {}
        for m, ss in [("grid", [grid])] + list(others.items()):
            for s in ss:
                assert s is not None
                c = best_by_k(s, mx)
                k, t_s = reached(s, ref, mx)
                k2, _ = reached(s, ref, mx, search_only=True)
                at_budget = c[min(plan.budget, len(c) - 1)] if c else math.inf
                rows.append([m, str(s.seed), str(len(c) - 1 if c else 0),
                             f1(unloss(at_budget, mx)), pct(unloss(at_budget, mx), ref),
                             "not reached" if k is None else str(k),
                             "-" if t_s is None else f"{t_s / 60:.1f}",
                             "not reached" if k2 is None else str(k2)])
                reach.setdefault(m, {})[str(s.seed)] = {
                    "launches_to_within": k, "seconds_to_within": t_s,
                    "launches_to_within_search_only": k2,
                    "best_at_budget": unloss(at_budget, mx), "tuned_launches": len(c) - 1}
        tables.append((f"Within {100 * WITHIN:.0f}% of the grid's best ({ref:.1f}): tuned "
                       "launches needed (0 = the baseline already was); 'search only' "
                       "leaves the baseline's value out",
                       ["method", "seed", "tuned launches", f"best at k={plan.budget}",
                        "vs grid best", "launches to 5%", "minutes to 5%",
                        "search only: launches"], rows))
        summary["within"] = reach

        # Verdicts.
        base_vals = [r["value"] for s in all_series for r in s.rows if r["role"] == "baseline"]
        if base_vals and all(v is not None for v in base_vals) and within(
                statistics.median(base_vals), ref, mx):
            lines.append("NOTE: the baseline (engine defaults) is itself within "
                         f"{100 * WITHIN:.0f}% of the grid's best: on this workload every "
                         "method 'reaches' it at k=0; see the 'search only' column.")
        fin = {m: [c[min(plan.budget, len(c) - 1)] if c else math.inf for c in curves[m]]
               for m in others}
        if "tpe" in others and others["tpe"]:
            n = len(others["tpe"])
            n_ok = sum(1 for s in others["tpe"]
                       if (k := reached(s, ref, mx)[0]) is not None and k <= plan.budget)
            m_tpe = med(fin["tpe"], mx)[0]
            verdict = ("met in every seed" if n_ok == n else
                       f"met by the median seed only ({n_ok} of {n})"
                       if within(m_tpe, ref, mx) else f"NOT met ({n_ok} of {n} seeds)")
            lines.append(
                f"Goal 1, TPE within {100 * WITHIN:.0f}% of the grid's best in <= "
                f"{plan.budget} tuned launches (a quarter of {plan.launchable}): reached in "
                f"{n_ok} of {n} seed(s); median best at budget {f1(m_tpe)} "
                f"({pct(m_tpe, ref)}) -> {verdict}")
            summary["goal_within"] = {"seeds_met": n_ok, "seeds": n,
                                      "median_best_at_budget": m_tpe, "verdict": verdict}
        if others.get("tpe") and others.get("random"):
            mt, mr = med(fin["tpe"], mx)[0], med(fin["random"], mx)[0]
            beat = mt is not None and (mr is None or loss(mt, mx) < loss(mr, mx))
            lines.append(f"Goal 2, TPE beats random at equal budget ({plan.budget} tuned "
                         f"launches), median best over seeds: tpe {f1(mt)} vs random "
                         f"{f1(mr)} -> {'yes' if beat else 'NO'}")
            summary["goal_beats_random"] = {"tpe": mt, "random": mr, "beats": beat}

    # Memory estimate and pruning, per method.
    rows, mem_sum, prune_sum = [], {}, {}
    for m, ss in ([("grid", [grid])] if grid else []) + list(others.items()):
        asked = skipped = launched_pred = right = oom_fit = 0
        pruned = 0
        saved = 0.0
        wall = 0.0
        notes = []
        for s in ss:
            assert s is not None
            for run in s.runs:
                tuned = [r for r in run.rows if not r["baseline"]]
                asked += len(tuned)
                skipped += sum(1 for r in tuned if r["reason"] == "predicted_oom")
                me = (run.result or {}).get("memory_estimate")
                pr = (run.result or {}).get("pruning")
                if me is None or pr is None:
                    me, pr = _own_estimates(run.rows)
                    if run.rows:
                        notes.append(f"{run.name}: computed from the study (qtune printed "
                                     "no summary)")
                launched_pred += me.get("launched_with_prediction", 0)
                right += me.get("prediction_right", 0)
                oom_fit += me.get("oom_at_start_despite_fit", 0)
                pruned += pr.get("pruned", 0)
                saved += pr.get("measure_s_saved", 0.0)
                wall += run.wall_s
        share = skipped / asked if asked else None
        rows.append([m, str(asked), str(skipped), "-" if share is None else f"{100 * share:.0f}%",
                     f"{right}/{launched_pred}", str(oom_fit), str(pruned), f"{saved:.0f}",
                     f"{100 * saved / (wall + saved):.1f}%" if wall + saved else "-",
                     "; ".join(notes)])
        mem_sum[m] = {"asked": asked, "skipped_no_launch": skipped, "share": share,
                      "launched_with_prediction": launched_pred, "prediction_right": right,
                      "oom_at_start_despite_fit": oom_fit}
        prune_sum[m] = {"pruned": pruned, "measure_s_saved": round(saved, 1),
                        "wall_s": round(wall, 1)}
    tables.append(("Memory estimate and pruning (asked = proposals after the baseline; "
                   "saved = qtune's pruning.measure_s_saved: unsent share of each pruned "
                   "trial's requests x a full measurement; % of wall + saved)",
                   ["method", "asked", "skipped (no launch)", "share", "fit predicted right",
                    "OOM despite fit", "pruned", "measure s saved", "of wall", "note"], rows))
    summary["memory_estimate"] = mem_sum
    summary["pruning"] = prune_sum

    # Noise: the same config measured in several runs.
    by_cfg: dict[str, list[float]] = {}
    for s in all_series:
        for r in s.rows:
            if r["value"] is not None:
                name = "baseline" if r["role"] == "baseline" else _short(r["params"])
                by_cfg.setdefault(name, []).append(r["value"])
    rep = {k: v for k, v in by_cfg.items() if len(v) > 1}
    summary["repeated_measurements"] = rep
    if "baseline" in rep:
        b = rep["baseline"]
        lines.append(f"Noise: the baseline was measured {len(b)} times (one per run): median "
                     f"{f1(statistics.median(b))}, range {f1(min(b))}-{f1(max(b))} "
                     f"({100 * (max(b) - min(b)) / statistics.median(b):.1f}% of the median).")
    spreads = [(max(v) - min(v)) / statistics.median(v) for k, v in rep.items()
               if k != "baseline"]
    if spreads:
        lines.append(f"Noise: {len(spreads)} tuned config(s) measured more than once; "
                     f"(max-min)/median: median {100 * statistics.median(spreads):.1f}%, "
                     f"max {100 * max(spreads):.1f}%.")
    failed = [f for s in all_series for f in s.failed]
    if failed:
        lines.append("FAILED/INCOMPLETE RUNS: " + " | ".join(failed))
    summary["failed_runs"] = failed
    return summary, tables, lines


def _own_estimates(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """qtune's end-of-study figures (``estimate_accuracy`` and the pruning
    saving in ``_finish``), computed the same way from the stored trials, for
    a run that exited before printing them."""
    launched = [r for r in rows if r["status"] in LAUNCHED and r["memory_fits"] is not None]
    mem = {
        "launches_avoided": sum(1 for r in rows if r["reason"] == "predicted_oom"),
        "launched_with_prediction": len(launched),
        "prediction_right": sum(1 for r in launched
                                if r["memory_fits"] == (r["reason"] != "oom")),
        "oom_at_start_despite_fit": sum(1 for r in launched
                                        if r["reason"] == "oom" and r["memory_fits"]),
    }
    full = sorted(r["measure_s"] for r in rows if r["status"] == "ok" and r["measure_s"])
    typical = full[len(full) // 2] if full else 0.0
    unsent = [r["requests_unsent"] for r in rows if r["requests_unsent"] is not None]
    return mem, {"pruned": len(unsent), "measure_s_saved": round(sum(unsent) * typical, 3)}


def _short(p: dict[str, Any] | None) -> str:
    if not p:
        return "engine defaults"
    names = {"max_num_seqs": "seqs", "max_num_batched_tokens": "mnbt",
             "VLLM_CPU_KVCACHE_SPACE": "kv"}
    return " ".join(f"{names.get(k, k)}={v}" for k, v in p.items()
                    if k not in ("enable_chunked_prefill", "enable_prefix_caching"))


# -- main ---------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2x2 grid, 1 seed, 100 requests (~6 min)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per method (3)")
    ap.add_argument("--seqs", default="4,8,16,32", help="max_num_seqs values")
    ap.add_argument("--mnbt", default="256,1024,4096,16384",
                    help="max_num_batched_tokens values")
    ap.add_argument("--kv", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE GiB (2)")
    ap.add_argument("--no-oversized-kv", action="store_true",
                    help="leave out the KV size above RAM that the memory estimate skips")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=400,
                    help="measured requests per trial (400: ~15 s at ~27 req/s)")
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--objective", default="e2e_p50")
    ap.add_argument("--trial-s", type=float, default=50.0,
                    help="assumed seconds per launch, for the estimate printed first (50)")
    ap.add_argument("--quiet", type=float, default=15.0,
                    help="before each run, wait until no other vLLM server has run for "
                    "this many seconds (15)")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for other servers")
    ap.add_argument("--out", type=Path, help="output folder (default benchmarks/results/"
                    "search-efficiency-<timestamp>)")
    args = ap.parse_args()
    if args.quick:
        args.seqs, args.mnbt, args.seeds, args.requests = "4,32", "256,4096", 1, 100

    import psutil

    ram_gib = psutil.virtual_memory().total / 2**30
    plan = Plan(
        seqs=[int(x) for x in args.seqs.split(",")],
        mnbt=[int(x) for x in args.mnbt.split(",")],
        kv=args.kv,
        # Above the host's RAM: the memory estimate must refuse it, whatever
        # else is running (weights + KV + headroom > available <= total).
        oversized_kv=None if args.no_oversized_kv else math.ceil(ram_gib) + 1,
        seeds=list(range(args.seeds)),
        concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
        requests=args.requests, warmup=args.warmup, objective=args.objective,
        trial_s=args.trial_s,
    )
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = (args.out or REPO / "benchmarks" / "results" /
           f"search-efficiency-{stamp}{'-quick' if args.quick else ''}").resolve()
    if out.exists() and any(out.iterdir()):
        # A study name that exists would be resumed, not re-run.
        sys.exit(f"{out} is not empty: give a new --out")
    for sub in ("studies", "console", "json", "spaces"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    space = out / "spaces" / "space.yaml"
    space.write_text(plan.space_yaml())

    per_run = 2.0  # qtune's own start to its first trial: ~0.5 s measured (args cached)
    n_runs = 1 + 2 * len(plan.seeds)
    launches = plan.launchable + 1 + 2 * len(plan.seeds) * (plan.budget + 1)
    est = (launches * plan.trial_s + n_runs * per_run) / 60
    kv_note = (f"|{plan.oversized_kv} (> {ram_gib:.1f} GiB RAM: the memory estimate must "
               "skip it)" if plan.oversized_kv else "")
    print(f"""search efficiency: qtune search on the embedded model, vLLM CPU
  workload  concurrency {plan.concurrency}, {plan.input_len} in / {plan.output_len} out tokens, \
{plan.requests} requests + {plan.warmup} warm-up; objective {plan.objective} \
({'max' if plan.maximize else 'min'}imise)
  space     max_num_seqs {'|'.join(map(str, plan.seqs))} x max_num_batched_tokens \
{'|'.join(map(str, plan.mnbt))} x VLLM_CPU_KVCACHE_SPACE {plan.kv}{kv_note};
            fixed enable_chunked_prefill=true, enable_prefix_caching=false ({space})
  budgets   grid {plan.launchable} tuned launches; random and tpe ceil({plan.launchable}/{SHARE}) \
= {plan.budget} each; every run adds the engine-defaults baseline as trial 0 (k=0)
  seeds     {plan.seeds} (qtune's --seed seeds the sampler and the prompts alike)
  estimate  {launches} launches x ~{plan.trial_s:.0f} s + {n_runs} qtune starts x ~{per_run:.0f} s \
~ {est:.0f} min (assumed per-launch time; +1 launch if the grid run misses a point)
  output    {out}""", flush=True)

    runs: list[Run] = []
    grid_runs: list[Run] = []
    others: dict[str, list[Series]] = {"random": [], "tpe": []}
    interrupted = False

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    prev = signal.signal(signal.SIGTERM, on_term)
    try:
        g = Run("grid-s0", "grid", 0, plan.launchable + 1, space)
        runs.append(g)
        grid_runs.append(g)
        run_qtune(g, plan, out, args)
        # Points the grid run never ran (the baseline takes grid point 0; a
        # crash can stop it early): each as its own one-launch run, all
        # params fixed (the "baseline" of that run is exactly the point).
        # Not when the grid run launched nothing: the fills would fail alike.
        covered = {key(r["params"]) for r in g.rows if not r["baseline"]}
        todo = [pt for pt in plan.points() if key(pt) not in covered] if g.rows else []
        big = [pt for pt in todo if pt["VLLM_CPU_KVCACHE_SPACE"] == plan.oversized_kv]
        if big:
            # A fixed config is launched without the memory check (it is the
            # run's baseline): it would only demonstrate an OOM start.
            print(f"\n== {len(big)} grid point(s) with VLLM_CPU_KVCACHE_SPACE="
                  f"{plan.oversized_kv} never came up in the grid run; not filled (the "
                  "search skips them without a launch)", flush=True)
        for i, p in enumerate(pt for pt in todo if pt not in big):
            fill_space = out / "spaces" / f"grid-fill-{i}.yaml"
            fill_space.write_text(plan.space_yaml(p))
            f = Run(f"grid-fill-{i}", "grid-fill", 0, 1, fill_space)
            print(f"\n== grid point {_short(p)} never ran in the grid run: running it alone",
                  flush=True)
            runs.append(f)
            grid_runs.append(f)
            run_qtune(f, plan, out, args)
            if not f.rows:
                break  # a setup failure: the other fills would fail the same way
        done = sum(r.launches() for r in runs)
        if done:
            left = 2 * len(plan.seeds) * (plan.budget + 1)
            spent = sum(r.wall_s for r in runs)
            print(f"\n== grid done: {done} launches in {spent / 60:.1f} min "
                  f"({spent / done:.0f} s each); the rest: {left} launches "
                  f"~ {left * spent / done / 60:.0f} min", flush=True)
        for i, seed in enumerate(plan.seeds):
            # Alternate which method goes first, so drift of the machine over
            # the session does not favour one of them.
            for m in ("random", "tpe") if i % 2 == 0 else ("tpe", "random"):
                r = Run(f"{m}-s{seed}", m, seed, plan.budget + 1, space)
                runs.append(r)
                try:
                    run_qtune(r, plan, out, args)
                finally:  # an interrupted run still shows what it measured
                    if r.rows or r.rc is not None:
                        others[m].append(Series(m, seed, [r]))
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: qtune stopped; writing what finished", flush=True)
    finally:
        signal.signal(signal.SIGTERM, prev)
    grid = Series("grid", 0, grid_runs) if grid_runs and grid_runs[0].rc is not None else None
    for m in others:
        others[m].sort(key=lambda s: s.seed)

    summary, tables, lines = analyse(plan, grid, others, out)
    summary.update({"interrupted": interrupted, "out": str(out), "plan": {
        k: getattr(plan, k) for k in ("seqs", "mnbt", "kv", "oversized_kv", "seeds",
                                      "concurrency", "input_len", "output_len", "requests",
                                      "warmup", "objective")} | {
        "launchable": plan.launchable, "budget": plan.budget, "ram_gib": round(ram_gib, 2)},
        "runs": [r.summary() for r in runs]})
    all_rows = [r for s in ([grid] if grid else []) + [s for ss in others.values() for s in ss]
                for r in s.rows]
    (out / "trials.json").write_text(json.dumps(all_rows, indent=1, default=str) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    text = []
    md = [f"# Search efficiency ({stamp}{', quick' if args.quick else ''}"
          f"{', INTERRUPTED' if interrupted else ''})", "",
          f"`{' '.join(['python', 'benchmarks/search_efficiency.py'] + sys.argv[1:])}`", "",
          f"Workload: concurrency {plan.concurrency}, {plan.input_len} in / {plan.output_len} "
          f"out tokens, {plan.requests} requests + {plan.warmup} warm-up; objective "
          f"`{plan.objective}`. Space: "
          + "; ".join(f"`{ln}`" for ln in space.read_text().splitlines()[1:]) + ".", ""]
    for title, heads, rows in tables:
        text += ["", title, table(heads, rows)]
        md += [f"## {title}", "", md_table(heads, rows), ""]
    text += [""] + lines
    md += ["## Verdicts and notes", ""] + [f"- {ln}" for ln in lines] + [""]
    print("\n".join(text), flush=True)
    (out / "summary.md").write_text("\n".join(md))
    print(f"\nwrote {out}/summary.md, summary.json, trials.json", flush=True)
    return 130 if interrupted else (1 if summary["failed_runs"] else 0)


if __name__ == "__main__":
    sys.exit(main())
