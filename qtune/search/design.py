"""Where a study starts: the engine's informed first points (its seeds) and
the start design the model-based samplers begin from (a Latin hypercube,
anchored on a seed that clearly beat the engine defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from qtune.params import Params
from qtune.search.choice import design_point
from qtune.search.inputs import Prepared
from qtune.search.records import Attr, TrialRecord
from qtune.search.reporter import Reporter
from qtune.search.space import initial_design, startup_trials, tidy
from qtune.search.trial import estimate_memory


def pending_seeds(prep: Prepared, study: optuna.Study,
                   engine: Mapping[str, str]) -> list[tuple[Params, str]]:
    """The engine's informed first points (``seeds``) not yet run in this
    study, that are in the tuned space, valid and predicted to fit.
    ``engine``: the attribute of its trials in a study across engines."""
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return []  # resumed with queued design points: those go first
    ran = [t.user_attrs.get(Attr.SEED_POINT) for t in study.get_trials(deepcopy=False)
           if t.user_attrs.get(Attr.ENGINE) == engine.get(Attr.ENGINE)]
    tuned = {p.name for p in prep.params}
    out = []
    for point, why in prep.engine.seeds(prep.params, prep.ctx, prep.fixed):
        if point in ran or not set(point) <= tuned:
            continue
        full = {**point, **prep.fixed}
        est = estimate_memory(prep, full)
        if prep.engine.check(full, prep.ctx) or (
                est is not None and not est.fits and prep.cfg.memory_check):
            continue
        out.append((point, why))
    return out


def start_design(prep: Prepared, study: optuna.Study, reporter: Reporter) -> None:
    """Model-based samplers start from a Latin hypercube instead of random
    points (see ``initial_design``); queued once, on a study's first run.
    When an engine seed beat the engine defaults, the design keeps the
    seed's values and spreads its few points over the other parameters."""
    cfg = prep.cfg
    if prep.engines:
        _design_engines(prep, study)
        return
    if cfg.sampler not in ("tpe", "gp") or not prep.params:
        return
    if _design_queued(study):
        return  # resumed: the design was queued (and probably run) before
    n = startup_trials(cfg.trials)
    anchor, why = _seed_anchor(prep, study)
    free = [p for p in prep.params if p.name not in anchor]
    if not free:
        return  # every tuned parameter is the seed's: the design would repeat it

    def valid(point: Params) -> bool:
        return _launchable(prep, {**tidy({**point, **anchor}, prep.params), **prep.fixed})

    if anchor:
        what = ", ".join(f"{k}={v}" for k, v in anchor.items())
        reporter.note(f"the start design keeps the seed's {what} ({why}) and spreads "
                      "over the other parameters")
    for point in initial_design(free, n, cfg.seed, valid):
        attrs: dict[str, Any] = {Attr.DESIGN: "latin-hypercube"}
        if anchor:
            attrs[Attr.AROUND_SEED] = anchor
        study.enqueue_trial({**point, **anchor}, user_attrs=attrs)


def _launchable(prep: Prepared, full: dict[str, Any]) -> bool:
    """A start-design point the engine accepts and (with the memory check)
    predicts to fit: the design spends no launch on one that cannot run."""
    if prep.engine.check(full, prep.ctx):
        return False
    est = estimate_memory(prep, full)
    return est is None or est.fits or not prep.cfg.memory_check


def _design_queued(study: optuna.Study) -> bool:
    """Whether the study has trials other than the baselines and seeds: a
    resumed study, whose start design was queued (and probably run) before."""
    return any(not (t.user_attrs.get(Attr.BASELINE) or t.user_attrs.get(Attr.SEED))
               for t in study.get_trials(deepcopy=False))


def _design_engines(prep: Prepared, study: optuna.Study) -> None:
    """``--engine a,b``: each engine's share of the start design, a Latin
    hypercube over its own space, the engines' points taken in turn (a
    short budget still starts each engine's sub-space).  No seed anchors
    it: a seed's gain over its own engine's defaults says nothing of the
    other engine's space."""
    cfg = prep.cfg
    subs = [s for s in prep.engines.values() if s.params]
    if cfg.sampler != "tpe" or not subs:
        return
    if _design_queued(study):
        return  # resumed: the design was queued (and probably run) before
    share = -(-startup_trials(cfg.trials) // len(subs))
    designs = []
    for sub in subs:
        def valid(point: Params, sub: Prepared = sub) -> bool:
            return _launchable(sub, {**tidy(point, sub.params), **sub.fixed})

        designs.append((sub.engine.name, initial_design(sub.params, share, cfg.seed, valid)))
    for i in range(max(len(points) for _, points in designs)):
        for name, points in designs:
            if i < len(points):
                study.enqueue_trial(design_point(name, points[i]), user_attrs={
                    Attr.DESIGN: "latin-hypercube", Attr.ENGINE: name})


# How much better than the engine defaults a seed must measure to anchor the
# start design: one run each, and a run varies by several percent (CPU VM:
# ~7%, benchmarks/noise_sources.py); the case it is for measured 4.7x.
_ANCHOR_MARGIN = 1.10


def _seed_anchor(prep: Prepared, study: optuna.Study) -> tuple[dict[str, Any], str]:
    """The point of the best engine seed that met the SLO and clearly beat
    the engine defaults (or the defaults did not run or missed the SLO), with
    why; else ({}, "").  A seed is the engine's informed guess; once measured
    better than the defaults (on 2xH200, one replica per GPU: p99 3.3 s
    against 15.8 s), a design of two or three points spent re-testing its
    parameter is spent where the answer is known, while the parameters it
    left at their defaults are untried.  The sampler stays free over the
    whole space after the design."""
    if prep.direction == "pareto":
        return {}, ""
    recs = [(TrialRecord.from_frozen(t), t.user_attrs)
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    base = next((r for r, _ in recs if r.baseline), None)
    sign = -1 if prep.direction == "maximize" else 1
    seeds = sorted(((r, a[Attr.SEED_POINT]) for r, a in recs
                    if a.get(Attr.SEED_POINT) and r.feasible and r.value is not None),
                   key=lambda ra: sign * ra[0].value)  # type: ignore[operator]
    if not seeds:
        return {}, ""
    best, point = seeds[0]
    if base is None or base.value is None:
        why = "the engine defaults did not run"
    elif not base.feasible:
        why = "the engine defaults missed the SLO"
    else:
        s, b = float(best.value), float(base.value)  # type: ignore[arg-type]
        gain = (b / s if sign > 0 else s / b) if min(s, b) > 0 else 0.0
        if gain < _ANCHOR_MARGIN:
            return {}, ""
        why = f"{gain:.1f}x better than the engine defaults"
    tuned = {p.name for p in prep.params}
    return {k: v for k, v in point.items() if k in tuned}, why
