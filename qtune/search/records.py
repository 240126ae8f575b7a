"""What a study stores about each trial, in one place: the trial statuses,
the user-attribute keys, the one writer (``write_record``) and the readers
(``TrialRecord.from_frozen``, ``feasible``, ``ran_trials``).

The search writes through here and ``qtune report`` reads through here, so
a key renamed on one side cannot silently read as missing on the other.
The strings are the stored format: studies written by earlier versions
must still read, so a value here is never changed, only added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import optuna
from optuna.trial import TrialState

# The reason of a capacity trial that did not hold the incumbent's capacity
# (pruned after its one floor probe, which is kept as its partial summary).
BELOW = "below_incumbent"


class TrialStatus(StrEnum):
    """What became of a trial (the ``status`` attribute)."""

    OK = "ok"  # measured in full
    INVALID = "invalid"  # refused without a launch (engine check, memory)
    STARTUP_FAILED = "startup_failed"
    LOAD_FAILED = "load_failed"  # the server died or failed under load
    PRUNED = "pruned"  # stopped mid-measurement: it could not win
    UNKNOWN = "unknown"  # no status stored, or one this version does not know

    @classmethod
    def read(cls, raw: object) -> TrialStatus:
        """The status a trial stored; UNKNOWN for none (or not a str: no
        member's value equals one)."""
        if isinstance(raw, str):
            try:
                return cls(raw)
            except ValueError:
                pass
        return cls.UNKNOWN


# The statuses of trials that launched a server (a refused one did not).
LAUNCHED = (TrialStatus.OK, TrialStatus.STARTUP_FAILED, TrialStatus.LOAD_FAILED,
            TrialStatus.PRUNED)


class Attr:
    """A trial's user-attribute keys."""

    # Written by write_record, from a TrialRecord.
    LAUNCH_PARAMS = "launch_params"  # the params the server ran with (fixed ones too)
    STATUS = "status"
    BASELINE = "baseline"  # the engine defaults
    REASON = "reason"
    DETAIL = "detail"
    SUMMARY = "summary"  # the measured run (a full measurement only)
    STARTUP_S = "startup_s"
    START_PHASES = "start_phases"  # where the start went (qtune.launch.StartPhases)
    MEASURE_S = "measure_s"
    TOTAL_S = "total_s"
    ARGV = "argv"
    ENV = "env"
    LOG = "log"
    # --levels: the load of this point and the trial whose server it shared;
    # when it was measured (Optuna's own times are when it was added).
    LOAD_LEVEL = "load_level"
    SERVER_OF = "server_of"
    STARTED = "started"
    FINISHED = "finished"
    # Set by the runner around a trial.
    BASELINE_NOTE = "baseline_note"
    SEED = "seed"  # why the engine proposed this point
    SEED_POINT = "seed_point"
    DESIGN = "design"  # a start-design point ("latin-hypercube")
    AROUND_SEED = "around_seed"
    MEMORY_ESTIMATE = "memory_estimate"
    OVER_REQUEST = "over_request"  # what a start that ran out of memory asked for
    PARTIAL_SUMMARY = "partial_summary"  # a pruned trial's run, kept apart
    REQUESTS_UNSENT = "requests_unsent"  # the share a pruned trial did not send
    # The quality gate (qtune.quality): the figure against the engine
    # defaults, and (the defaults' trial only) the reference sample.
    QUALITY = "quality"
    QUALITY_SAMPLE = "quality_sample"
    # The speculative-decoding phase (qtune.search.speculative): the base
    # trial a speculative candidate ran on top of.
    SPEC_OF = "spec_of"
    # --engine a,b: the engine a trial launched (absent on a study of one
    # engine, whose every trial is that engine's).
    ENGINE = "engine"


class StudyAttr:
    """A study's user-attribute keys."""

    OBJECTIVE = "objective"
    WORKLOAD = "workload"
    LEVELS = "levels"
    EXACT = "exact"
    MODEL = "model"
    OPTUNA_VERSION = "optuna_version"
    ENGINE_INSTALL = "engine_install"  # what --pick needs without the engine
    SPACE_NOTES = "space_notes"
    CONFIRMATION = "confirmation"  # trial number (str) -> medians of re-runs
    MAX_QUALITY_LOSS = "max_quality_loss"
    SPECULATIVE = "speculative"  # the spec phase: candidates, A/B, kept or not
    ENGINES = "engines"  # --engine a,b: the engines searched across, in order
    # where the search wrote the profile when --out named a path (absolute):
    # the report's deploy command names that file, not profiles/<study>.yaml
    PROFILE = "profile"


@dataclass
class TrialRecord:
    number: int
    params: dict[str, Any]
    status: TrialStatus
    baseline: bool = False
    value: float | None = None  # the objective (the latency, for pareto)
    values: list[float] | None = None  # pareto: [throughput, latency]
    feasible: bool = False
    reason: str | None = None
    detail: str | None = None
    summary: dict[str, Any] | None = None
    # A pruned trial's run (stopped early, or a capacity below the
    # incumbent's): kept apart from full measurements.
    partial_summary: dict[str, Any] | None = None
    startup_s: float | None = None
    start_phases: dict[str, Any] | None = None
    measure_s: float | None = None
    total_s: float | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log: str | None = None
    # --levels: the load this point was measured at, and the trial whose
    # server it shared (None: the trial launched its own server).
    load_level: float | None = None
    server_of: int | None = None
    started: str | None = None  # ISO times from the study (Optuna's own)
    finished: str | None = None
    quality: dict[str, Any] | None = None  # qtune.quality.Quality.to_dict()
    spec_of: int | None = None  # a speculative candidate: its base trial
    engine: str | None = None  # --engine a,b: the trial's engine

    @classmethod
    def from_frozen(cls, t: optuna.trial.FrozenTrial) -> TrialRecord:
        a = t.user_attrs
        done = t.state == TrialState.COMPLETE
        multi = done and len(t.values or []) > 1
        return cls(
            number=t.number,
            params=a.get(Attr.LAUNCH_PARAMS, dict(t.params)),
            status=TrialStatus.read(a.get(Attr.STATUS, TrialStatus.UNKNOWN)),
            baseline=bool(a.get(Attr.BASELINE)),
            value=(t.values[1] if multi else t.value) if done else None,
            values=list(t.values) if multi else None,
            feasible=t.state == TrialState.COMPLETE and feasible(t),
            reason=a.get(Attr.REASON),
            detail=a.get(Attr.DETAIL),
            summary=a.get(Attr.SUMMARY),
            partial_summary=a.get(Attr.PARTIAL_SUMMARY),
            startup_s=a.get(Attr.STARTUP_S),
            start_phases=a.get(Attr.START_PHASES),
            measure_s=a.get(Attr.MEASURE_S),
            total_s=a.get(Attr.TOTAL_S),
            argv=a.get(Attr.ARGV, []),
            env=a.get(Attr.ENV, {}),
            log=a.get(Attr.LOG),
            load_level=a.get(Attr.LOAD_LEVEL),
            server_of=a.get(Attr.SERVER_OF),
            # A --levels point records when it was measured; Optuna's times
            # for it are when it was added.
            started=a.get(Attr.STARTED) or (t.datetime_start.isoformat()
                                            if t.datetime_start else None),
            finished=a.get(Attr.FINISHED) or (t.datetime_complete.isoformat()
                                              if t.datetime_complete else None),
            quality=a.get(Attr.QUALITY),
            spec_of=a.get(Attr.SPEC_OF),
            engine=a.get(Attr.ENGINE),
        )


# The record's fields write_record stores when set (an empty list or dict is
# not stored: the reader's default gives it back).
_WRITTEN = (Attr.REASON, Attr.DETAIL, Attr.SUMMARY, Attr.PARTIAL_SUMMARY, Attr.STARTUP_S,
            Attr.START_PHASES,
            Attr.MEASURE_S,
            Attr.TOTAL_S, Attr.ARGV, Attr.ENV, Attr.LOG, Attr.QUALITY)


def write_record(trial: optuna.Trial, rec: TrialRecord) -> None:
    """Store what ``rec`` says about ``trial``: the one writer of a trial's
    record attributes, read back by ``TrialRecord.from_frozen``."""
    trial.set_user_attr(Attr.LAUNCH_PARAMS, rec.params)
    trial.set_user_attr(Attr.STATUS, str(rec.status))
    # The baseline mark is set when the trial is queued; stored here only
    # where it is not, so a study's journal holds what it always held.
    if rec.baseline and not trial.user_attrs.get(Attr.BASELINE):
        trial.set_user_attr(Attr.BASELINE, True)
    for key in _WRITTEN:
        val = getattr(rec, key)
        if val is not None and val != [] and val != {}:
            trial.set_user_attr(key, val)


def feasible(t: optuna.trial.FrozenTrial) -> bool:
    """Whether every constraint of a trial holds (all <= 0)."""
    c = t.constraints or {}
    values = c.values() if isinstance(c, dict) else c
    return all(v <= 0 for v in values)


def ran_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials without the queued ones that never ran (design
    points left when a budget ended)."""
    return [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]


def maximizes(study: optuna.Study) -> bool:
    """Whether larger values are better: a single-objective study that
    maximises (pareto: the value is the latency, smaller is better)."""
    return len(study.directions) == 1 and \
        study.direction == optuna.study.StudyDirection.MAXIMIZE
