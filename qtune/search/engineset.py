"""The engines a study searches: one (a study of one engine) or several
(``--engine a,b``: the engine a categorical parameter, each with its own
sub-space).  The runner asks this object (``engines_of``) what differs
between the two, so that the trial lifecycle reads the same for both:
which prepared studies run their defaults and seeds, what marks a trial as
an engine's, how the sampler is asked, how the space is shaped by the
defaults' run, and what the study records and reports."""

from __future__ import annotations

import dataclasses

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from qtune.engines.base import LoadView
from qtune.params import Params
from qtune.search.choice import qualified, suggest
from qtune.search.inputs import Prepared
from qtune.search.records import Attr, StudyAttr
from qtune.search.reporter import Reporter
from qtune.search.result import best_trial
from qtune.search.space import describe, distributions


class OneEngine:
    """A study of one engine: its journal names no engine on a trial."""

    def __init__(self, prep: Prepared) -> None:
        self.prep = prep

    def each(self) -> list[Prepared]:
        """The prepared study of each engine searched, in the order named."""
        return [self.prep]

    def attr(self, sub: Prepared) -> dict[str, str]:
        """The attribute that marks a trial as ``sub``'s engine's (none with
        one engine: its journal stays as it was)."""
        return {}

    def names(self) -> list[str] | None:
        """The engines as the study records them (None: one engine)."""
        return None

    def record(self, study: optuna.Study) -> None:
        """The engines in the study's attributes (nothing with one: its
        journal stays as it was)."""

    def distributions(self) -> dict[str, BaseDistribution] | None:
        """What ``study.ask`` is given: the one fixed space, or None where
        each trial suggests its engine's sub-space (``sample``)."""
        return distributions(self.prep.params)

    def sample(self, trial: optuna.Trial) -> tuple[Prepared, Params]:
        """An asked trial's engine (its prepared study) and its values."""
        return self.prep, trial.params

    def of_best(self, study: optuna.Study) -> Prepared:
        """The prepared study of the winner's engine."""
        return self.prep

    def note(self, sub: Prepared, text: str) -> str:
        """A trial's note, naming its engine where there are several."""
        return text

    def space(self) -> dict[str, str]:
        return {p.name: describe(p) for p in self.prep.params}

    def fixed(self) -> Params:
        return dict(self.prep.fixed)

    def shape(self, study: optuna.Study) -> tuple[Prepared, list[str]]:
        """The study with each engine's space narrowed by the load and its
        defaults' run (``Engine.shape``), and the notes that says why."""
        return shape_one(self.prep, study, None)


class SeveralEngines(OneEngine):
    """``--engine a,b``: each trial names its engine (``Attr.ENGINE``) and
    samples the engine first, then that engine's parameters."""

    def each(self) -> list[Prepared]:
        return list(self.prep.engines.values())

    def attr(self, sub: Prepared) -> dict[str, str]:
        return {Attr.ENGINE: sub.engine.name}

    def names(self) -> list[str] | None:
        return list(self.prep.engines)

    def record(self, study: optuna.Study) -> None:
        study.set_user_attr(StudyAttr.ENGINES, self.names())

    def distributions(self) -> dict[str, BaseDistribution] | None:
        return None

    def sample(self, trial: optuna.Trial) -> tuple[Prepared, Params]:
        return suggest(self.prep, trial)

    def of_best(self, study: optuna.Study) -> Prepared:
        best = best_trial(study)
        return self.prep.of(best.engine if best else None)

    def note(self, sub: Prepared, text: str) -> str:
        return f"{sub.engine.name}: {text}"

    def space(self) -> dict[str, str]:
        return {qualified(n, p.name): describe(p)
                for n, sub in self.prep.engines.items() for p in sub.params}

    def fixed(self) -> Params:
        return {qualified(n, k): v for n, sub in self.prep.engines.items()
                for k, v in sub.fixed.items()}

    def shape(self, study: optuna.Study) -> tuple[Prepared, list[str]]:
        subs: dict[str, Prepared] = {}
        notes: list[str] = []
        for name, sub in self.prep.engines.items():
            subs[name], mine = shape_one(sub, study, name)
            notes += [f"{name}: {n}" for n in mine]
        first = next(iter(subs.values()))
        return dataclasses.replace(self.prep, params=first.params, fixed=first.fixed,
                                   engines=subs), notes


def engines_of(prep: Prepared) -> OneEngine:
    """The engines ``prep`` searches: one, or several (``--engine a,b``)."""
    return SeveralEngines(prep) if prep.engines else OneEngine(prep)


def shape(prep: Prepared, study: optuna.Study, reporter: Reporter, *,
          record: bool = True) -> Prepared:
    """Let each engine narrow its space with the load and its defaults' run.
    Computed from what the study stored, so a resumed study gets the same
    space (and the sampler the same distributions) as the first run; the
    notes reported, and with ``record`` kept in the study (``--pick`` reads
    a study and never rewrites it)."""
    shaped, notes = engines_of(prep).shape(study)
    for n in notes:
        reporter.note(n)
    if record:
        study.set_user_attr(StudyAttr.SPACE_NOTES, notes)
    return shaped


def shape_one(prep: Prepared, study: optuna.Study,
              engine: str | None) -> tuple[Prepared, list[str]]:
    """One engine's space shaped by its defaults' completed run (``engine``:
    whose, in a study across engines); the params ``--space`` named are
    kept as given."""
    base = next((t for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get(Attr.BASELINE) and t.state == TrialState.COMPLETE
                 and t.user_attrs.get(Attr.ENGINE) == engine), None)
    wl = prep.cfg.workload
    load = LoadView(
        rate=wl.rate, concurrency=wl.concurrency if wl.rate is None else None,
        shared_prefix=bool(wl.prefix_count) or wl.dataset is not None,
        baseline=base.user_attrs.get(Attr.SUMMARY) if base else None,
        baseline_params=base.user_attrs.get(Attr.LAUNCH_PARAMS, {}) if base else {},
    )
    mine = [p for p in prep.params if p.name not in prep.user_set]
    kept, fixed, notes = prep.engine.shape(mine, prep.ctx, load)
    if prep.lossless_why:
        notes = [prep.lossless_why, *notes]
    params = [p for p in prep.params if p.name in prep.user_set] + kept
    return dataclasses.replace(prep, params=params, fixed={**fixed, **prep.fixed}), notes
