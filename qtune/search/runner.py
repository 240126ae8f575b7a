"""The study's run: the engine defaults first, then the engine's seeds, the
start design and the sampler's trials, within the trial count and time
budget, then the top-K confirmation.

Three flows share the study's opening and its trial lifecycle: ``--pick``,
``--finish`` and the search (``TuneConfig.flow`` says which).  What differs
between one host and a fleet's workers is one object the run asks
(``qtune.search.coordination``), and between one engine and several another
(``qtune.search.engineset``): neither is a condition here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from qtune.objectives import get_objective
from qtune.params import JSONObject, Params
from qtune.search.budget import (
    TrialBudget,
    costs,
    over_budget,
    study_end,
    trial_budget,
)
from qtune.search.config import TuneConfig
from qtune.search.confirm import confirmation, confirmation_plan
from qtune.search.coordination import OneHost, coordination, launched_count
from qtune.search.design import pending_seeds, start_design
from qtune.search.engineset import engines_of, shape
from qtune.search.inputs import Prepared, prepare
from qtune.search.opening import create_or_join, load_to_finish, open_study, open_to_pick
from qtune.search.records import (
    Attr,
    TrialRecord,
    ran_trials,
)
from qtune.search.reporter import NullReporter, Reporter
from qtune.search.result import TuneResult, best_trial, finish
from qtune.search.space import make_sampler, tidy
from qtune.search.speculative import speculative_phase
from qtune.search.trial import estimate_memory, refuse, run_trial


def tune(cfg: TuneConfig, reporter: Reporter | None = None) -> TuneResult:
    from qtune import files

    files.reset()  # one call is one command: its inputs are the ones it reads
    prep = prepare(cfg)
    return run_study(prep, reporter or NullReporter())


def run_study(prep: Prepared, reporter: Reporter) -> TuneResult:
    """Run a prepared study to its end and write its profile: the engine
    defaults first, then the engine's seeds, the start design and the
    sampler's trials until --trials launches or the time budget, then the
    confirmation of the top configs.  On a database server storage this is
    one worker of a fleet (``qtune.search.fleet``): a lost database stops it
    with one error."""
    coord = coordination(prep)
    try:
        return _run_study(prep, coord, reporter)
    except (KeyboardInterrupt, Exception) as exc:
        if (lost := coord.lost(exc)) is not None:
            raise lost from None
        raise


def _run_study(prep: Prepared, coord: OneHost, reporter: Reporter) -> TuneResult:
    """The run's flow (``TuneConfig.flow``)."""
    return _FLOWS[prep.cfg.flow](prep, coord, reporter)


def _pick(prep: Prepared, coord: OneHost, reporter: Reporter) -> TuneResult:
    """``--pick``: one trial's profile of a finished study; nothing runs, and
    the storage is read-only by construction."""
    study = open_to_pick(prep)
    reporter.study_started(_study_info(prep))
    return finish(shape(prep, study, reporter, record=False), study)


def _finish_study(prep: Prepared, coord: OneHost, reporter: Reporter) -> TuneResult:
    """``--finish``: the conclusion of a study its workers ran."""
    study, _ = open_study(prep, coord, load_to_finish)
    reporter.study_started(_study_info(prep))
    started = coord.started(study)
    return _conclude(shape(prep, study, reporter), study, reporter, started, None)


def _search_study(prep: Prepared, coord: OneHost, reporter: Reporter) -> TuneResult:
    """The search (open or join, then sample) and, on the worker that claims
    it, the conclusion."""
    study, opener = open_study(prep, coord, create_or_join)
    reporter.study_started(_study_info(prep))
    started = coord.started(study)
    prep, stop_reason = _search(prep, coord, study, reporter, started, opener)
    if stop_reason:
        reporter.note(f"stopped before --trials: {stop_reason}")
    if not coord.claim_finish(study, reporter):
        res = _worker_result(prep, study)
        res.stop_reason = stop_reason
        return res
    return _conclude(prep, study, reporter, started, stop_reason)


def _search(prep: Prepared, coord: OneHost, study: optuna.Study, reporter: Reporter,
            started: float, opener: bool) -> tuple[Prepared, str | None]:
    """The search: the opening (the engine defaults, the seeds, the start
    design) by the worker that opens the study, the space as it shaped it
    for one that joins, then the sampler's trials.  Returns the shaped
    study and why it stopped before --trials (None: it did not)."""
    if not opener:
        opener = coord.wait_for_opening(study, reporter)
    if opener:
        prep, stop_reason = _opening(prep, study, reporter, started)
        coord.opened(study)
    else:
        prep, stop_reason = shape(prep, study, reporter), None
        study.sampler = make_sampler(prep.cfg.sampler, prep.params, prep.cfg.seed,
                                     prep.cfg.trials)
    if not stop_reason:
        stop_reason = _sampling_loop(prep, coord, study, reporter, started)
    return prep, stop_reason


def _opening(prep: Prepared, study: optuna.Study, reporter: Reporter,
             started: float) -> tuple[Prepared, str | None]:
    """Each engine's defaults (``--engine a,b``: in the order named), the
    space shaped by them, the engine's seeds, then the start design."""
    cfg = prep.cfg
    engines = engines_of(prep)
    for sub in engines.each():
        engine = engines.attr(sub)
        if not _has_baseline(sub, study, engine.get(Attr.ENGINE)) and \
                launched_count(study) < cfg.trials:
            base_params, note = sub.engine.baseline(sub.ctx)
            _run_unsampled(sub, study, reporter, {**base_params, **sub.fixed},
                           {Attr.BASELINE: True, **engine,
                            **({Attr.BASELINE_NOTE: note} if note else {})},
                           budget=_budget(prep, study, started))
    prep = shape(prep, study, reporter)
    study.sampler = make_sampler(cfg.sampler, prep.params, cfg.seed, cfg.trials)
    stop_reason = _run_seeds(prep, study, reporter, started)
    if not stop_reason and launched_count(study) < cfg.trials:
        # Queued only when the loop will take them: a queued point left over
        # would come out of a later ask() in place of what was queued then.
        start_design(prep, study, reporter)
    return prep, stop_reason


def _conclude(prep: Prepared, study: optuna.Study, reporter: Reporter, started: float,
              stop_reason: str | None) -> TuneResult:
    """The confirmation of the top configs, speculative decoding on the
    winner, then the profile."""
    confirmation(prep, study, reporter, started)
    _speculative(prep, study, reporter, started)
    res = finish(prep, study)
    res.stop_reason = stop_reason
    return res


def _worker_result(prep: Prepared, study: optuna.Study) -> TuneResult:
    """What a worker that does not finish the study reports: its trials and
    the best so far, no profile (the finishing worker writes it)."""
    recs = [TrialRecord.from_frozen(t) for t in ran_trials(study)]
    return TuneResult(
        study_name=prep.study_name, storage=prep.storage_url, best=best_trial(study),
        baseline=next((r for r in recs if r.baseline), None), trials=recs,
        profile_path=None, profile=None, improvement=None)


def _study_info(prep: Prepared) -> dict[str, Any]:
    """What ``Reporter.study_started`` is told."""
    cfg = prep.cfg
    engines = engines_of(prep)
    return {
        "study": prep.study_name,
        "storage": prep.storage_url,
        "model": prep.ctx.model.summary(),
        "engine": ", ".join(f"{p.ctx.install.name} {p.ctx.install.version} "
                            f"({p.ctx.install.build})" for p in engines.each()),
        "space": engines.space(),
        "fixed": engines.fixed(),
        "trials": cfg.trials,
        "time_budget": cfg.time_budget,
        "workload": cfg.workload.to_dict(),
        "levels": list(cfg.levels),
        "objective": cfg.objective,
        "slo": [str(s) for s in cfg.slo],
    }


def _has_baseline(prep: Prepared, study: optuna.Study, engine: str | None = None) -> bool:
    """Whether the engine defaults ran already (a resume runs them once);
    ``engine``: whose, in a study across engines."""
    cfg = prep.cfg
    return any(
        t.user_attrs.get(Attr.BASELINE) and t.user_attrs.get(Attr.ENGINE) == engine and (
            t.state == TrialState.COMPLETE
            # refused as too big: a resume does not ask again (unless the
            # memory check is now off)
            or (t.user_attrs.get(Attr.REASON) == "predicted_oom" and cfg.memory_check))
        for t in study.get_trials(deepcopy=False)
    )


def _over_budget(prep: Prepared, study: optuna.Study, started: float) -> str | None:
    """Start a trial only if a typical one, and the confirmation planned
    after the search, still fit in the budget (``qtune.search.budget``).
    With a gated objective (capacity) the confirmation as it stands: a
    trial joins it only by beating the defaults, and its own search ends in
    time for that (``_budget``); a trial that holds the best so far too late
    to search upward ties, and a tie is not confirmed.  Otherwise as if the
    trial joined it."""
    trying = not get_objective(prep.cfg.objective).gated
    return over_budget(prep.cfg, study, started,
                       confirmation_plan(prep, study, trying=trying))


def _budget(prep: Prepared, study: optuna.Study, started: float) -> TrialBudget | None:
    """When a trial's capacity search must end so that the confirmation
    still fits, and whether the confirmation re-measures its answer
    (``qtune.search.budget.trial_budget``)."""
    return trial_budget(prep.cfg, started, confirmation_plan(prep, study, trying=True))


def _run_seeds(prep: Prepared, study: optuna.Study, reporter: Reporter,
               started: float) -> str | None:
    """Run the engine's seeds not yet run; why it stopped early, if it did."""
    cfg = prep.cfg
    engines = engines_of(prep)
    stop_reason = None
    pending = [(sub, point, why) for sub in engines.each()
               for point, why in pending_seeds(sub, study, engines.attr(sub))]
    for sub, point, why in pending:
        if launched_count(study) >= cfg.trials or (
                stop_reason := _over_budget(prep, study, started)):
            break
        # Param-less like the baseline: TPE's groups would otherwise split
        # its one param off from the rest.  The queue is empty here
        # (_pending_seeds), so ask() returns this trial.
        _run_unsampled(sub, study, reporter, {**point, **sub.fixed},
                       {Attr.SEED: why, Attr.SEED_POINT: point, **engines.attr(sub)},
                       note=engines.note(sub, why),
                       budget=_budget(prep, study, started))
    return stop_reason


def _sampling_loop(prep: Prepared, coord: OneHost, study: optuna.Study,
                   reporter: Reporter, started: float) -> str | None:
    """Ask the sampler for trials until --trials launches; why it stopped
    early, if it did."""
    cfg = prep.cfg
    engines = engines_of(prep)
    # --engine a,b: the engine, then its params, suggested trial by trial.
    dists = engines.distributions()
    stop_reason = None
    invalid_run = 0
    while launched_count(study) < cfg.trials:
        if invalid_run >= 25:
            # Every recent proposal was refused without a launch: what is left
            # of the space cannot start.  Stop rather than spin.
            stop_reason = "the last 25 proposals were all refused without a launch"
            break
        if stop_reason := _over_budget(prep, study, started):
            break
        if isinstance(study.sampler, optuna.samplers.GridSampler) and \
                study.sampler.is_exhausted(study):
            stop_reason = "every grid point has been tried"
            break
        if coord.taken(study):
            continue
        trial = study.ask(dists)
        sub, values = engines.sample(trial)
        # (the trial's own engine's host facts: --engine a,b)
        with coordination(sub).running(study, trial, reporter):
            if coord.asked_past_budget(study, trial):
                continue  # another worker asked first
            # A trial queued without params (a seed re-run for a dead worker)
            # carries its launch params.
            params = trial.user_attrs.get(Attr.LAUNCH_PARAMS) or \
                {**tidy(values, sub.params), **sub.fixed}
            violations = sub.engine.check(params, sub.ctx)
            reason = "invalid_config"
            learned = _learned_refusal(study, params, trial.user_attrs.get(Attr.ENGINE))
            if learned and not violations:
                violations, reason = [learned], "learned_oom"
            est = estimate_memory(sub, params)
            if est is not None:
                trial.set_user_attr(Attr.MEMORY_ESTIMATE, est.as_dict())
                if not est.fits and cfg.memory_check:
                    violations.append("predicted not to fit: " + est.reason)
                    reason = "predicted_oom"
            invalid_run = invalid_run + 1 if violations else 0
            if violations:
                refuse(study, trial, params, reason, "; ".join(violations), reporter)
                continue
            run_trial(sub, study, trial, params, reporter,
                      budget=_budget(prep, study, started))
    return stop_reason


def _speculative(prep: Prepared, study: optuna.Study, reporter: Reporter,
                 started: float) -> None:
    """The speculative-decoding phase on the chosen base config
    (``qtune.search.speculative``), within what the time budget has left."""
    left = None if (end := study_end(prep.cfg, started)) is None else end - time.monotonic()
    # --engine a,b: the phase runs on the chosen config's engine.
    engines = engines_of(prep)
    sub = engines.of_best(study)

    def launch(params: Params, attrs: JSONObject, note: str) -> None:
        _run_unsampled(sub, study, reporter, params, {**attrs, **engines.attr(sub)},
                       note=note)

    speculative_phase(sub, study, reporter, launch, left, costs(study).trial_s)


def _run_unsampled(prep: Prepared, study: optuna.Study, reporter: Reporter,
                   params: dict[str, Any], attrs: dict[str, Any],
                   note: str | None = None, budget: TrialBudget | None = None) -> None:
    """Launch a trial no sampler chose (the baseline, an engine seed).  It is
    queued without params, so that no sampler spends one of its points on it
    (the grid sampler would otherwise assign it a grid cell) or models it;
    its launch params are kept in its attributes."""
    if not any(all(t.user_attrs.get(k) == v for k, v in attrs.items())
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
        # (A fleet's opener that died left this point queued for a retry.)
        study.enqueue_trial({}, user_attrs={**attrs, Attr.LAUNCH_PARAMS: params})
    trial = study.ask()
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if note:
        reporter.note(f"trial {trial.number}: {note}")
    with coordination(prep).running(study, trial, reporter):
        if violations := prep.engine.check(params, prep.ctx):
            # The engine defaults with what --space fixes, which the engine
            # would refuse at start (an fp8 KV cache on a CPU without
            # AVX-512): refused here as a sampled config would be.
            refuse(study, trial, params, "invalid_config", "; ".join(violations), reporter)
            return
        est = estimate_memory(prep, params)
        if est is not None:
            trial.set_user_attr(Attr.MEMORY_ESTIMATE, est.as_dict())
            if not est.fits and prep.cfg.memory_check:
                # The engine defaults can be too big for the host (a 70B model
                # at TP 1): minutes of loading weights only to fail.  Seeds are
                # filtered before this, so only the baseline gets here.
                refuse(study, trial, params, "predicted_oom",
                       "predicted not to fit: " + est.reason, reporter)
                return
        run_trial(prep, study, trial, params, reporter, budget=budget)


def _learned_refusal(study: optuna.Study, params: dict[str, Any],
                     engine: str | None = None) -> str | None:
    """A config that asks for at least the memory a failed start asked for
    (the engine said it asked for more than was free) fails the same way:
    refuse it without a launch.  Learned from launches, so it also covers
    what the memory estimate got wrong or was turned off for.  ``engine``:
    learned from that engine's launches only, in a study across engines."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(Attr.ENGINE) != engine:
            continue
        asked = t.user_attrs.get(Attr.OVER_REQUEST)
        if asked and all(k in params and params[k] >= v for k, v in asked.items()):
            what = ", ".join(f"{k}={v}" for k, v in asked.items())
            return (f"asks at least the memory of trial {t.number} ({what}), "
                    "which failed to start asking for more than was free")
    return None


_FLOWS: dict[str, Callable[[Prepared, OneHost, Reporter], TuneResult]] = {
    "pick": _pick, "finish": _finish_study, "search": _search_study}
