"""``qtune verify``: A/B a profile against the engine defaults (or another
profile) with fresh server starts, interleaved, and report the ratio of
medians with a bootstrap 95% interval.

Each repeat starts each server anew (ABBA order across repeats, so a drift
of the machine does not favour either side), runs the profile's own workload
with the repeat's seed, and stops it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from qtune import seeds
from qtune.bench import KEY_METRICS, BenchConfig
from qtune.engines import get_engine, on_this_host
from qtune.engines import probe_host as probe
from qtune.engines.base import SpaceContext
from qtune.errors import EngineError, InputError, ModelError, ProfileError, ServerError
from qtune.load.workload import Workload
from qtune.measure import interleaved, measure_server
from qtune.metrics import metric_value
from qtune.model import resolve_model
from qtune.objectives import SLO, get_objective, lower_is_better, parse_slo
from qtune.params import JSONObject
from qtune.profile import Profile
from qtune.seeds import Phase
from qtune.server import free_port
from qtune.stats import bootstrap_median, ratio_ci


@dataclasses.dataclass
class Side:
    label: str
    argv: list[str]
    env: dict[str, str]


def _with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    if "--port" not in out:
        raise ProfileError("the profile's argv has no --port",
                           hint="profiles from `qtune search` always carry one")
    out[out.index("--port") + 1] = str(port)
    return out


def profile_context(profile: Profile) -> SpaceContext:
    host = probe(engine_python=profile.argv[0])
    install = host.engines.get(profile.engine.name)
    if install is None:
        raise EngineError(f"{profile.engine.name} is not installed for {profile.argv[0]}",
                          hint="run verify where the profile's engine is installed")
    path = profile.model.get("path")
    if not path or not Path(path).is_dir():
        raise ModelError(f"the profile's model folder {path} is missing",
                         hint="verify runs on the host the profile was tuned for")
    mml = get_engine(profile.engine.name).max_model_len(profile.argv)
    # Serve under the profile's name: the defaults side must answer to the
    # same model name the measurement asks for.
    model = dataclasses.replace(resolve_model(path),
                                served_name=str(profile.model.get("served_name")))
    return SpaceContext(host, model, install, mml)


def check_model_folders(profile: Profile) -> None:
    """The profile's model folder (and --tokenizer folder) must still exist:
    said before the probe or any launch, not by a server that fails to load
    after minutes."""
    from qtune.errors import printable

    path = profile.model.get("path")
    if not isinstance(path, str) or not path or not Path(path).is_dir():
        raise ModelError(
            f"profile {printable(profile.name)}: model folder "
            f"{printable(str(path))[:200]} does not exist",
            hint="verify runs on the host the profile was tuned for, with the model "
            "where it was; re-run qtune search if it moved")
    argv = profile.argv
    if "--tokenizer" in argv[:-1]:
        tok = argv[argv.index("--tokenizer") + 1]
        if not Path(tok).is_dir():
            raise ModelError(
                f"profile {printable(profile.name)}: tokenizer folder "
                f"{printable(tok)[:200]} does not exist",
                hint="qtune search generates it under ~/.cache/qtune; re-run the "
                "search (or qtune search --pick) on this host")


class Measured(NamedTuple):
    runs: dict[str, list[dict[str, Any]]]  # per side, the summaries of its runs
    starts: dict[str, list[float]]  # per side, seconds to ready of those runs
    # per side, the starts that failed: a flaky start is a data point (it is
    # reported), not the end of a measurement that has run for many minutes
    failed: dict[str, list[ServerError]]


def measure_sides(
    sides: list[Side],
    engine_name: str,
    ctx: SpaceContext,
    workload: Workload,
    repeat: int,
    progress: Callable[[str], None] | None = None,
    startup_timeout: float = 600.0,
    log_dir: Path = Path("studies/verify"),
    on_run: Callable[[str], None] | None = None,
    slo: list[SLO] | None = None,
) -> Measured:
    """Start each side anew per repeat and run the workload on it.

    The order rotates by one side per repeat (ABBA for two), so a drift of the
    machine over the session does not favour a side; repeat r uses the
    workload's round-r seed (``seeds.Phase.VERIFY``) on every side, so the sides see
    the same prompts."""
    engine = get_engine(engine_name)
    # The engine's own spec, with each side's command in it: its watch
    # patterns and this host's run defaults (vLLM: the shared compile cache)
    # hold for every side, and a field added to LaunchSpec is not dropped.
    ref = on_this_host(engine, engine.launch_spec({}, ctx, host="127.0.0.1", port=8000),
                       ctx.install)
    wl, served = workload, ctx.model.served_name
    runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in sides}
    starts: dict[str, list[float]] = {s.label: [] for s in sides}
    failed: dict[str, list[ServerError]] = {s.label: [] for s in sides}
    log_dir.mkdir(parents=True, exist_ok=True)
    for r, side in interleaved(sides, repeat):
        if progress:
            progress(f"repeat {r + 1}/{repeat}: {side.label}: starting")
        port = free_port()
        spec = dataclasses.replace(ref, argv=tuple(_with_port(side.argv, port)),
                                   env=side.env, port=port)
        w = dataclasses.replace(wl, seed=seeds.seed(wl.seed, Phase.VERIFY, r))
        cfg = BenchConfig(urls=[spec.base_url], workload=w, model=served,
                          tokenizer=ctx.model.tokenizer_dir, slo=slo or [],
                          metric_names=engine.metric_names(),
                          reset_paths=engine.cache_reset_paths(),
                          request_fields=engine.request_fields())

        def tick(text: str, side: Side = side, r: int = r) -> None:
            if progress:
                progress(f"repeat {r + 1}/{repeat}: {side.label}: {text}")

        try:
            m = measure_server(spec, log_dir / f"{side.label}-{r}.log", cfg,
                               startup_timeout=startup_timeout, classify=engine.classify,
                               progress=tick)
        except ServerError as e:
            failed[side.label].append(e)
            if on_run:
                on_run(f"repeat {r + 1}/{repeat}: {side.label}: start failed: {e.cause}")
            continue
        assert m.startup_s is not None  # measure_server started it
        summary = m.to_dict()
        starts[side.label].append(m.startup_s)
        runs[side.label].append(summary)
        if on_run:  # one lasting line per run: the spinner alone vanishes
            on_run(f"repeat {r + 1}/{repeat}: {side.label}: " + run_line(summary, m.startup_s))
    return Measured(runs, starts, failed)


def run_line(summary: JSONObject, start_s: float) -> str:
    def ms(name: str) -> str:
        v = metric_value(summary, name)
        return "-" if v is None else f"{v:,.1f} ms"

    return (f"ready in {start_s:.0f} s; e2e p99 {ms('e2e_p99')}, TTFT p50 "
            f"{ms('ttft_p50')}, TPOT p50 {ms('tpot_p50')}, "
            f"{summary.get('request_throughput', 0):.2f} req/s"
            + (f" (overloaded: {summary['overloaded']})" if summary.get("overloaded") else ""))


class VerifyResult(TypedDict):
    """What ``qtune verify`` measured, as ``--json`` prints it."""

    profile: str
    against: str  # the other side's label: "defaults" or "other"
    repeats: int
    objective: str  # the profile's
    judged_by: str  # the run metric the objective is judged on
    at_load: str | None  # a capacity profile: the load both sides ran
    slo: list[str]
    slo_met: dict[str, int] | None  # per side, the runs that met every SLO
    # per metric: each side's median, ci95 and values, and the profile's
    # "gain" (> 1: better) with its interval
    metrics: dict[str, JSONObject]
    failed_requests: dict[str, int]  # per side
    failed_starts: dict[str, list[str]]  # per side, why each start failed
    startup_s: dict[str, list[float]]  # per side, its starts' seconds to ready
    note: str | None  # what the defaults side had to set to start here
    wall_s: float


def verify(
    profile: Profile,
    against: Profile | None,
    repeat: int,
    progress: Callable[[str], None] | None = None,
    startup_timeout: float = 600.0,
    log_dir: Path = Path("studies/verify"),
    on_run: Callable[[str], None] | None = None,
) -> VerifyResult:
    engine = get_engine(profile.engine.name)
    if against is None and not profile.params:
        raise ProfileError(
            f"profile {profile.name} is the engine defaults (no tuned parameters): "
            "there is nothing to compare",
            hint="verify a profile whose search found a better config, or use "
            "--against OTHER_PROFILE")
    for prof in (profile, against):
        if prof is not None:
            check_model_folders(prof)
    ctx = profile_context(profile)
    a = Side("profile", profile.argv, dict(profile.env))
    if against is None:
        params, note = engine.baseline(ctx)
        spec = engine.launch_spec(params, ctx, host="127.0.0.1", port=8000)
        b = Side("defaults", list(spec.argv), dict(spec.env))
    else:
        note = None
        b = Side("other", against.argv, dict(against.env))
    name = profile.metrics.get("objective", {}).get("name", "e2e_p99")
    slo = parse_slo(",".join(profile.slo)) if profile.slo else []
    workload, at_load = _verify_load(profile, name)
    t0 = time.monotonic()
    runs, starts, failed_starts = measure_sides(
        [a, b], profile.engine.name, ctx, workload, repeat,
        progress=progress, startup_timeout=startup_timeout, log_dir=log_dir, on_run=on_run,
        slo=slo)
    for side in (a, b):
        if not runs[side.label]:  # nothing to compare: why it never started
            raise failed_starts[side.label][-1]
    try:
        judged = get_objective(name).run_metric
    except InputError:
        # A profile names an objective this qtune does not know (a later
        # version's): judged as the metric of that name, if runs have one.
        judged = name
    metrics = [judged] + [m for m in KEY_METRICS if m != judged]
    table: dict[str, Any] = {}
    for m in metrics:
        va = [v for s in runs[a.label] if (v := metric_value(s, m)) is not None]
        vb = [v for s in runs[b.label] if (v := metric_value(s, m)) is not None]
        if not va or not vb:
            continue
        row = {}
        for label, vals in ((a.label, va), (b.label, vb)):
            med, lo, hi = bootstrap_median(vals)
            row[label] = {"median": med, "ci95": [lo, hi] if lo is not None else None,
                          "values": vals}
        # gain > 1 means the profile is better, whatever the metric's sense.
        ratio = ratio_ci(va, vb) if lower_is_better(m) else ratio_ci(vb, va)
        row["gain"] = ratio
        table[m] = row
    failed = {k: sum(s["failed"] for s in v) for k, v in runs.items()}
    # How many of each side's runs met every SLO the profile was tuned for.
    slo_met = ({k: sum(1 for s in v if (s.get("goodput") or {}).get("slo_met")) for k, v
                in runs.items()} if slo else None)
    return {"profile": profile.name, "against": b.label, "repeats": repeat,
            "objective": name, "judged_by": judged, "at_load": at_load,
            "slo": [str(x) for x in slo], "slo_met": slo_met,
            "metrics": table, "failed_requests": failed,
            "failed_starts": {k: [e.cause for e in v] for k, v in failed_starts.items()},
            "startup_s": starts, "note": note, "wall_s": time.monotonic() - t0}


def _verify_load(profile: Profile, objective: str) -> tuple[Workload, str | None]:
    """The load both sides run: the profile's workload, or for a capacity
    profile that workload at the capacity it measured (does it still hold
    there, and what do the defaults do at that load?)."""
    wl = Workload(**profile.workload)
    if objective != "capacity":
        return wl, None
    cap = profile.metrics.get("objective", {}).get("best")
    if not isinstance(cap, (int, float)) or not cap > 0:
        raise ProfileError(f"profile {profile.name}: tuned for capacity but has no "
                           "measured capacity (metrics.objective.best)",
                           hint="re-run the search; a study whose every trial missed "
                           "the SLO has no capacity to verify")
    if wl.concurrency is not None:
        return dataclasses.replace(wl, concurrency=int(cap)), f"concurrency {int(cap)}"
    return dataclasses.replace(wl, rate=float(cap)), f"{float(cap):g} req/s"

