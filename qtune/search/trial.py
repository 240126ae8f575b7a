"""One trial: launch the config's server, measure it (``qtune.measure``),
tell the study what it taught (measured, refused, failed to start, pruned),
and the ``--levels`` points measured on the same server."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from qtune import seeds
from qtune.bench import BenchConfig
from qtune.capacity import CapacityPlan, CapacityResult
from qtune.engines import trial_spec
from qtune.errors import ServerError
from qtune.estimate import Estimate
from qtune.launch import LaunchSpec
from qtune.load.workload import Workload
from qtune.measure import Measurement, ServerDied, measure_load, measure_server
from qtune.metrics import metric_value
from qtune.objectives import get_objective
from qtune.params import Params
from qtune.quality import Quality, Sample, compare, not_measured, take_sample, violation
from qtune.quality import reason as quality_reason
from qtune.search.budget import TrialBudget
from qtune.search.config import TuneConfig
from qtune.search.inputs import Prepared, at_load
from qtune.search.pruning import make_pruner
from qtune.search.records import BELOW, Attr, TrialRecord, TrialStatus, feasible, write_record
from qtune.search.reporter import Reporter
from qtune.search.result import best_trial
from qtune.seeds import Phase
from qtune.server import free_port

# Infrastructure faults say nothing about the configuration: retry them.
_RETRYABLE = {"port_in_use"}


def tell(study: optuna.Study, trial: optuna.Trial, rec: TrialRecord, reporter: Reporter,
         values: list[float] | None = None) -> None:
    """The one place a trial's outcome is recorded and told, then reported:
    a measured trial with its ``values`` (the objective, or throughput and
    latency for a Pareto study; feasible by its constraints), any other
    outcome pruned (refused, failed at start or under load, stopped early,
    below the incumbent: TPE ranks it below every run and learns the
    region).  (A trial closed unrun, or left RUNNING by a killed process,
    is failed where that is found: the runner.)"""
    write_record(trial, rec)
    if values is None:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        rec.value = values[-1]  # pareto: the latency
        if len(values) > 1:
            rec.values = values
        study.tell(trial, values if len(values) > 1 else values[0])
        rec.feasible = feasible(study.get_trials(deepcopy=False)[trial.number])
    reporter.trial_done(rec, best_trial(study))


def refuse(study: optuna.Study, trial: optuna.Trial, params: Params, reason: str,
            detail: str, reporter: Reporter) -> None:
    """Record a config refused without a launch."""
    tell(study, trial, TrialRecord(trial.number, params, TrialStatus.INVALID, reason=reason,
                                   detail=detail), reporter)


def estimate_memory(prep: Prepared, params: Params) -> Estimate | None:
    try:
        return prep.engine.estimate(params, prep.ctx)
    except (KeyError, ValueError, TypeError, ZeroDivisionError):
        return None  # an unusual config.json: no prediction rather than no study


def run_trial(
    prep: Prepared,
    study: optuna.Study,
    trial: optuna.Trial,
    params: Params,
    reporter: Reporter,
    budget: TrialBudget | None = None,
) -> None:
    """Launch, measure and tell one trial; ``budget``: what a capacity
    search may spend under ``--time-budget``."""
    try:
        lower = _run_trial_inner(prep, study, trial, params, reporter, budget)
        for level, m in lower:
            _add_level_point(prep, study, trial, params, level, m, reporter)
    except BaseException:
        # Ctrl-C or SIGTERM mid-trial: the server is already stopped by its
        # context manager; close the trial so a resume does not see it RUNNING.
        try:
            study.tell(trial, state=TrialState.FAIL)
        except (ValueError, RuntimeError):
            pass  # already told
        raise


@dataclasses.dataclass(frozen=True)
class _Launched:
    """A trial's server measured: its measurement, the ``--levels`` points
    taken on it below the study's load, and its quality (when scored)."""

    m: Measurement
    lower: list[tuple[float, Measurement]]
    quality: Quality | None


def _run_trial_inner(
    prep: Prepared,
    study: optuna.Study,
    trial: optuna.Trial,
    params: dict[str, Any],
    reporter: Reporter,
    budget: TrialBudget | None = None,
) -> list[tuple[float, Measurement]]:
    """Launch, measure, tell.  Returns the --levels points measured on this
    server below the study's load, for the caller to add as trials."""
    n = trial.number
    t0 = time.monotonic()
    log_path = prep.study_dir / f"trial-{n:03d}.log"
    rec = TrialRecord(n, params, TrialStatus.OK,
                      baseline=bool(trial.user_attrs.get(Attr.BASELINE)), log=str(log_path))
    launched = _launch(prep, study, trial, params, rec, log_path, reporter, budget)
    rec.total_s = time.monotonic() - t0
    if launched is None:
        tell(study, trial, rec, reporter)
        return []  # a server that died: its lower levels are not kept either
    return _tell_measured(prep, study, trial, rec, launched, reporter)


def _launch(prep: Prepared, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any],
            rec: TrialRecord, log_path: Path, reporter: Reporter,
            budget: TrialBudget | None) -> _Launched | None:
    """Start the config's server and measure it (an infrastructure fault is
    retried on a new port).  None: it failed to start or under load, with
    why in ``rec``."""
    cfg = prep.cfg
    n = trial.number
    lower: list[tuple[float, Measurement]] = []
    quality: list[Quality] = []  # set on the server after its measurement
    best = best_trial(study)
    # A speculative candidate runs in full: its acceptance rate is what it
    # is for, and it is judged against its base in the phase's A/B.
    candidate = trial.user_attrs.get(Attr.SPEC_OF) is not None
    plan = capacity_plan(prep, best, rec.baseline or candidate, budget)
    watch = None if rec.baseline or plan or candidate else make_pruner(
        cfg, best.value if best and prep.direction != "pareto" else None)

    def ready(startup_s: float) -> None:
        rec.startup_s = startup_s

    for attempt in range(3):
        port = free_port()
        spec = trial_spec(prep.engine, params, prep.ctx, port)
        rec.argv, rec.env = list(spec.argv), dict(spec.env)
        reporter.trial_phase(n, "starting", _short(params) or "engine defaults")

        def before(spec: LaunchSpec = spec) -> None:
            nonlocal lower
            lower = _lower_levels(prep, spec, n, reporter) if cfg.levels else []
            reporter.trial_phase(n, "measuring", cfg.workload.mode)

        def after(m: Measurement, spec: LaunchSpec = spec) -> None:
            below = m.capacity_result is not None and m.capacity_result.below is not None
            if not below and (not m.stopped_early or m.stopped_early == "saturated"):
                quality[:] = [_quality(prep, study, trial, spec, params, reporter)]

        try:
            m = measure_server(
                spec, log_path, bench_config(prep, spec, cfg.workload),
                startup_timeout=cfg.startup_timeout, classify=prep.engine.classify,
                progress=lambda text: reporter.trial_phase(n, "measuring", text),
                watch=watch, capacity=plan,
                on_tick=lambda s: reporter.trial_phase(n, "starting", f"{s:.0f} s"),
                on_ready=ready, before=before, after=after,
                # A server that died under load is a failed config, not a
                # slow one: checked before the numbers are trusted.
                check_alive=True, phases=prep.engine.start_phases)
        except ServerError as exc:
            if isinstance(exc, ServerDied):
                rec.measure_s = exc.measurement.measure_s
            if exc.reason in _RETRYABLE and attempt < 2:
                continue
            _failed(prep, trial, params, rec, exc)
            return None
        rec.measure_s = m.measure_s
        if m.start_phases is not None:
            rec.start_phases = m.start_phases.to_dict()
        return _Launched(m, lower, quality[0] if quality else None)
    raise AssertionError("unreachable: the last attempt returns")


def _failed(prep: Prepared, trial: optuna.Trial, params: dict[str, Any], rec: TrialRecord,
            exc: ServerError) -> None:
    """A config that failed to start or under load, in its record; a start
    refused for memory keeps what it asked for (see _learned_refusal)."""
    rec.status = (TrialStatus.STARTUP_FAILED if rec.measure_s is None
                  else TrialStatus.LOAD_FAILED)
    rec.reason, rec.detail = exc.reason, exc.detail or exc.message
    knobs = prep.engine.memory_asks(rec.detail or "") if rec.measure_s is None else ()
    asked = {k: params[k] for k in knobs if k in params}
    if asked:
        trial.set_user_attr(Attr.OVER_REQUEST, asked)


def _tell_measured(prep: Prepared, study: optuna.Study, trial: optuna.Trial,
                   rec: TrialRecord, launched: _Launched,
                   reporter: Reporter) -> list[tuple[float, Measurement]]:
    """Tell what a measured server taught: below the incumbent (a capacity
    trial's one probe), stopped early (pruned, with how far it got), or its
    values with its constraints (the SLOs, failed requests, quality).
    Returns the ``--levels`` points to keep (none from a config below the
    incumbent)."""
    cfg = prep.cfg
    m = launched.m
    summary = m.to_dict()
    rec.summary = summary
    if m.capacity_result is not None and m.capacity_result.below is not None:
        _tell_below(prep, study, trial, rec, m.capacity_result, reporter)
        return []
    if cfg.levels:
        rec.load_level = _level_of(cfg.workload)
        trial.set_user_attr(Attr.LOAD_LEVEL, rec.load_level)
    if m.stopped_early and m.stopped_early != "saturated":
        # Pruned mid-measurement: tell TPE how far it got, not a full value.
        done = m.completed + m.failed
        planned = cfg.workload.requests or done
        partial = get_objective(cfg.objective).value(summary)
        # Optuna has no intermediate values for multi-objective studies.
        if partial is not None and not math.isnan(partial) and prep.direction != "pareto":
            trial.report(partial, step=done)
        rec.status, rec.reason = TrialStatus.PRUNED, "pruned"
        # Percentiles over the requests that finished before the stop would
        # read better than the truth: keep them apart from real summaries.
        rec.partial_summary, rec.summary = summary, None
        trial.set_user_attr(Attr.REQUESTS_UNSENT, max(planned - done, 0) / max(planned, 1))
        rec.detail = (f"{m.stopped_early} after {done}/{planned} requests")
        tell(study, trial, rec, reporter)
        return launched.lower
    q = launched.quality
    if q is not None:
        rec.quality = q.to_dict()
        if violation(q, cfg.quality.max_loss) > 0:
            rec.reason, rec.detail = "quality_loss", quality_reason(q, cfg.quality.max_loss)
    for name, v in _constraints(cfg, summary, rec.quality).items():
        trial.set_constraint(name, v)
    tell(study, trial, rec, reporter, _values(prep, summary))
    return launched.lower


def capacity_plan(prep: Prepared, best: TrialRecord | None,
                  no_floor: bool, budget: TrialBudget | None = None) -> CapacityPlan | None:
    """How a capacity trial searches (None: not a capacity study).  After the
    engine defaults, each config is probed first at the best capacity so far,
    over the incumbent's window: one that does not hold there cannot win and
    costs one probe (issue 27).  The engine defaults (of each engine, across
    engines) and a speculative candidate search from the study's load."""
    cfg = prep.cfg
    if cfg.objective != "capacity":
        return None
    wl = cfg.workload
    start = float(wl.rate if wl.rate is not None else (wl.concurrency or 1))
    cap = ((best.summary or {}).get("capacity") or {}) if best is not None else {}
    if no_floor or best is None or not cap.get("found") or best.value is None:
        plan = CapacityPlan(start=start, tolerance=cfg.capacity.tolerance)
    else:
        plan = CapacityPlan(start=start, floor=float(best.value), window_s=cap.get("window_s"),
                            tolerance=cfg.capacity.tolerance, floor_of=f"trial {best.number}")
    if budget is None:
        return plan
    return dataclasses.replace(plan, deadline=budget.deadline,
                               remeasure=not budget.confirmed_later)


def _tell_below(prep: Prepared, study: optuna.Study, trial: optuna.Trial,
                rec: TrialRecord, cap: CapacityResult, reporter: Reporter) -> None:
    """A capacity trial that did not hold the incumbent's capacity: it cannot
    win, and its one probe is what it taught.  Pruned (TPE ranks it below
    every measured config), with the goodput it kept at that load as its
    intermediate value, so TPE can still tell a near miss from a far one."""
    summary = rec.summary or {}
    good = metric_value(summary, "goodput")
    if good is not None and math.isfinite(good):
        trial.report(good, step=1)
    rec.status, rec.reason = TrialStatus.PRUNED, BELOW
    rec.detail = cap.reason
    rec.partial_summary, rec.summary = summary, None
    tell(study, trial, rec, reporter)


def _constraints(cfg: TuneConfig, summary: dict[str, Any],
                 quality: dict[str, Any] | None = None) -> dict[str, float]:
    """A measured trial's constraints (feasible when all are <= 0): failed
    requests, each SLO's violation, and the quality loss beyond
    --max-quality-loss (only where quality was measured, or a config that
    changes numerics could not be)."""
    out = {"failed_requests": float(summary["failed"])}
    q = Quality.from_dict(quality)
    if q is not None and (q.measured or violation(q, cfg.quality.max_loss) > 0):
        out["quality_loss"] = violation(q, cfg.quality.max_loss)
    if summary.get("contaminated"):
        # Measured on cached prefills: not the workload asked for, so it
        # may not win (qtune.bench.CONTAMINATED_HIT_RATE).
        out["contaminated"] = 1.0
    for slo in cfg.slo:
        out[str(slo)] = slo.violation(metric_value(summary, slo.metric))
    return out


def _values(prep: Prepared, summary: dict[str, Any]) -> list[float]:
    """What the study is told: [objective], or [throughput, latency] for
    pareto."""
    value = get_objective(prep.cfg.objective).value(summary)
    if value is None or math.isnan(value):
        # Nothing succeeded: no latency to rank.  Worst possible value keeps
        # the trial informative without a NaN (which Optuna marks FAIL).
        value = 0.0 if prep.direction == "maximize" else 1e12
    if prep.direction == "pareto":
        return [metric_value(summary, "throughput") or 0.0, value]
    return [value]


def bench_config(prep: Prepared, spec: LaunchSpec, wl: Workload) -> BenchConfig:
    """How a trial measures ``wl`` on the server of ``spec``."""
    return BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model,
                       tokenizer=prep.ctx.model.tokenizer_dir, slo=prep.cfg.slo,
                       metric_names=prep.engine.metric_names(),
                       reset_paths=prep.engine.cache_reset_paths(),
                       request_fields=prep.engine.request_fields(),
                       capacity_window=prep.cfg.capacity.window,
                       capacity_tolerance=prep.cfg.capacity.tolerance)


def _level_of(wl: Any) -> float:
    return float(wl.rate if wl.rate is not None else wl.concurrency)


def _lower_levels(prep: Prepared, spec: Any, n: int,
                  reporter: Reporter) -> list[tuple[float, Measurement]]:
    """``--levels``: measure the levels below the study's load (its highest
    level) on the server already up, lightest first.  Sharing one server is
    valid here because nothing a level leaves behind changes the next: each
    level has its own warm-up and its own prompts (another seed, so prefix
    caching cannot reuse the previous level's), and every request of a level
    has finished before the next starts."""
    cfg = prep.cfg
    out = []
    for i, level in enumerate(sorted(cfg.levels)[:-1]):
        wl = dataclasses.replace(at_load(cfg.workload, level),
                                 seed=seeds.seed(cfg.workload.seed, Phase.LEVEL, i + 1))

        def progress(text: str, level: float = level) -> None:
            reporter.trial_phase(n, "measuring", f"level {level:g}: {text}")

        # Kept with the point: its own measuring time and when it ran (the
        # trial itself is only created once the launch's top level is told).
        out.append((level, measure_load(spec, bench_config(prep, spec, wl),
                                        progress=progress)))
    return out


def _add_level_point(prep: Prepared, study: optuna.Study, trial: optuna.Trial,
                     params: dict[str, Any], level: float, m: Measurement,
                     reporter: Reporter) -> None:
    """One --levels point as a trial of its own: the same engine config (and
    sampled params) as ``trial``, whose server it shared."""
    frozen = study.get_trials(deepcopy=False)[trial.number]
    # "baseline" is copied on purpose: a point of the defaults' server is the
    # defaults at that load (the improvement at a level compares with it).
    attrs = {k: v for k, v in frozen.user_attrs.items()
             if k in (Attr.LAUNCH_PARAMS, Attr.ARGV, Attr.ENV, Attr.LOG, Attr.STARTUP_S,
                      Attr.BASELINE, Attr.QUALITY, Attr.REASON, Attr.DETAIL, Attr.ENGINE)}
    summary = m.to_dict()
    measured = {Attr.STARTED: m.started, Attr.FINISHED: m.finished,
                Attr.MEASURE_S: m.measure_s}
    attrs.update({Attr.STATUS: str(TrialStatus.OK), Attr.SUMMARY: summary,
                  Attr.LOAD_LEVEL: level, Attr.SERVER_OF: trial.number, **measured})
    study.add_trial(optuna.trial.create_trial(
        values=_values(prep, summary), params=frozen.params,
        distributions=frozen.distributions, user_attrs=attrs,
        constraints=_constraints(prep.cfg, summary, frozen.user_attrs.get(Attr.QUALITY))))
    # Found by its attributes, not as "the last trial": storage may be shared.
    added = next(TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get(Attr.SERVER_OF) == trial.number
                 and t.user_attrs.get(Attr.LOAD_LEVEL) == level)
    reporter.trial_done(added, best_trial(study))


def _quality(prep: Prepared, study: optuna.Study, trial: optuna.Trial, spec: Any,
             params: dict[str, Any], reporter: Reporter) -> Quality:
    """The trial's quality figure (``qtune.quality``), taken on its server
    after its measurement; the engine defaults' sample is kept as the
    study's reference."""
    numerics = prep.engine.changes_numerics(params)
    if prep.ctx.model.load_format == "dummy":
        return not_measured("random weights (--load-format dummy)", numerics)
    if prep.engine.logprobs_request(spec.served_model, "") is None:
        return not_measured(f"{prep.engine.name} answers no log-probabilities", numerics)
    baseline = bool(trial.user_attrs.get(Attr.BASELINE))
    ref = None if baseline else reference_sample(study, trial.user_attrs.get(Attr.ENGINE))
    if ref is None and not baseline:
        return not_measured("no reference: the engine defaults were not measured",
                            numerics)
    reporter.trial_phase(trial.number, "quality", "scoring the evaluation text")
    try:
        sample = take_sample(prep.engine, spec.base_url, spec.served_model)
    except (OSError, ValueError) as exc:
        return not_measured(f"the server's answers could not be read "
                            f"({type(exc).__name__}: {exc})"[:240], numerics)
    if ref is None:
        trial.set_user_attr(Attr.QUALITY_SAMPLE, sample.to_dict())
        return compare(sample, sample, numerics, reference=True)
    return compare(ref, sample, numerics)


def reference_sample(study: optuna.Study, engine: str | None = None) -> Sample | None:
    """The engine defaults' quality sample (the first one kept); ``engine``:
    that engine's defaults, in a study across engines."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(Attr.BASELINE) and Attr.QUALITY_SAMPLE in t.user_attrs \
                and t.user_attrs.get(Attr.ENGINE) == engine:
            return Sample.from_dict(t.user_attrs[Attr.QUALITY_SAMPLE])
    return None


def _short(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())
