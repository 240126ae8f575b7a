"""Opening a study: created or joined (the search), loaded (``--finish``)
or read-only (``--pick``); checked against the run that resumes it, and
recording what it is run with."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.study import StudyDirection

from qtune.errors import StudyError, mask_url
from qtune.objectives import get_objective
from qtune.search import fleet, optuna_api
from qtune.search.coordination import OneHost
from qtune.search.engineset import engines_of
from qtune.search.inputs import Prepared
from qtune.search.records import StudyAttr, ran_trials
from qtune.search.space import make_sampler
from qtune.search.storage import open_storage


def open_study(prep: Prepared, coord: OneHost,
                get: Callable[[Prepared, OneHost, BaseStorage, BaseSampler],
                              tuple[optuna.Study, bool]],
                ) -> tuple[optuna.Study, bool]:
    """The study as ``get`` opens it (``create_or_join``: created, or loaded
    to resume, its runs left RUNNING by a killed qtune failed;
    ``load_to_finish``), checked against this run and recording what it is
    run with.  Also whether this process opens it (runs the baseline and
    queues the start design): on one host always; in a fleet, the worker
    whose create_study made it (the database makes that atomic on the
    name), or one resuming an opening."""
    cfg = prep.cfg
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(prep.storage_url, heartbeat_s=coord.heartbeat_s)
    sampler = make_sampler(cfg.sampler, prep.params, cfg.seed, cfg.trials)
    study, opener = get(prep, coord, storage, sampler)
    want = [d.name.lower() for d in _directions(prep)]
    have = [d.name.lower() for d in study.directions]
    if have != want:  # create_study checks this only for a study it loads itself
        raise StudyError(
            f"study {prep.study_name}: its directions are {have}, this run's {want}",
            hint="a resumed study must keep its objective direction")
    check_resume(study, prep)
    # (a re-pick, which measures nothing, opens the study itself: any host may
    # write it)
    fleet.check_hosts(study, fleet.host_facts(prep.host, prep.ctx.install),
                      cfg.fleet.allow_mixed_hosts, prep.study_name)
    coord.tidy(study)
    record_setup(study, prep)
    prep.study_dir.mkdir(parents=True, exist_ok=True)
    return study, opener


def _directions(prep: Prepared) -> list[StudyDirection]:
    """The study's directions: pareto maximises throughput and minimises the
    latency percentile; any other objective has its one."""
    names = ["maximize", "minimize"] if prep.direction == "pareto" else [prep.direction]
    return [StudyDirection[n.upper()] for n in names]


def open_to_pick(prep: Prepared) -> optuna.Study:
    """--pick reads a finished study and writes only the profile: the
    storage is read-only by construction (no trial failed, no attribute
    rewritten, no table created)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=prep.study_name,
                                 storage=open_storage(prep.storage_url, read_only=True))
    except KeyError:
        raise StudyError(f"--pick: no study {prep.study_name} in "
                         f"{mask_url(prep.storage_url)}",
                         hint="--pick writes a profile of an existing study") from None


def load_to_finish(prep: Prepared, coord: OneHost, storage: BaseStorage,
                    sampler: BaseSampler) -> tuple[optuna.Study, bool]:
    """--finish: the study its workers ran, loaded (this process opens
    nothing)."""
    try:
        return optuna.load_study(study_name=prep.study_name, storage=storage,
                                 sampler=sampler), False
    except KeyError:
        raise StudyError(f"--finish: no study {prep.study_name} in "
                         f"{mask_url(prep.storage_url)}",
                         hint="--finish confirms and writes the profile of a study "
                         "its workers ran; run them first") from None


def create_or_join(prep: Prepared, coord: OneHost, storage: BaseStorage,
                    sampler: BaseSampler) -> tuple[optuna.Study, bool]:
    """The study created (or on one host resumed), or joined in a fleet when
    another worker made it; and whether this process opens it."""
    try:
        return optuna.create_study(study_name=prep.study_name, storage=storage,
                                   sampler=sampler, load_if_exists=not coord.joins,
                                   directions=_directions(prep)), True
    except optuna.exceptions.DuplicatedStudyError:
        # A fleet's study made by another worker: join it.
        return optuna.load_study(study_name=prep.study_name, storage=storage,
                                 sampler=sampler), False
    except ValueError as exc:
        raise StudyError(
            f"study {prep.study_name}: {exc}",
            hint="a resumed study must keep its objective direction",
        ) from None


def record_setup(study: optuna.Study, prep: Prepared) -> None:
    """What the study is run with, in its attributes: the objective, the
    workload, the model, the versions, and what --pick needs to write a
    profile where the engine is not installed."""
    cfg = prep.cfg
    study.set_user_attr(StudyAttr.OBJECTIVE, cfg.objective)
    optuna_api.name_values(study, get_objective(cfg.objective).study_values)
    study.set_user_attr(StudyAttr.WORKLOAD, cfg.workload.to_dict())
    study.set_user_attr(StudyAttr.LEVELS, list(cfg.levels))
    study.set_user_attr(StudyAttr.EXACT, cfg.quality.exact)
    study.set_user_attr(StudyAttr.MAX_QUALITY_LOSS, cfg.quality.max_loss)
    study.set_user_attr(StudyAttr.MODEL, prep.ctx.model.summary())
    study.set_user_attr(StudyAttr.OPTUNA_VERSION, optuna.__version__)
    study.set_user_attr(StudyAttr.ENGINE_INSTALL, dataclasses.asdict(prep.ctx.install))
    engines_of(prep).record(study)


def check_resume(study: optuna.Study, prep: Prepared) -> None:
    ran_with = study.user_attrs.get(StudyAttr.ENGINES)
    engines = engines_of(prep).names()
    if ran_with != engines and (ran_with is not None or ran_trials(study)):
        before = ",".join(ran_with) if ran_with else \
            (study.user_attrs.get(StudyAttr.ENGINE_INSTALL) or {}).get("name", "one engine")
        raise StudyError(
            f"study {prep.study_name} was run with --engine {before}, not {prep.cfg.engine}",
            hint="use a new --study NAME, or the same --engine as before")
    wl = study.user_attrs.get(StudyAttr.WORKLOAD)
    if wl is not None and wl != prep.cfg.workload.to_dict():
        raise StudyError(
            f"study {prep.study_name} was run with another workload",
            hint="use a new --study NAME, or the same load flags as before",
        )
    for key, now in (("levels", list(prep.cfg.levels)), ("exact", prep.cfg.quality.exact)):
        before = study.user_attrs.get(key)
        if before is not None and before != now:
            raise StudyError(
                f"study {prep.study_name} was run with --{key} {before}, not {now}",
                hint="use a new --study NAME, or the same flags as before")
    obj = study.user_attrs.get(StudyAttr.OBJECTIVE)
    if obj is not None and obj != prep.cfg.objective:
        raise StudyError(
            f"study {prep.study_name} optimises {obj}, not {prep.cfg.objective}",
            hint="use a new --study NAME",
        )
