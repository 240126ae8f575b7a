"""How a study tells its progress: the ``Reporter`` a caller passes to
``run_study`` (the CLI's console one prints it; ``NullReporter`` drops it)."""

from __future__ import annotations

from typing import Protocol

from qtune.params import JSONObject
from qtune.search.records import TrialRecord


class Reporter(Protocol):
    """Hears a study's progress; it never changes the study.  Called from the
    runner and each trial, in this order: ``study_started`` once (the study,
    storage, model, engine, space and load, as a dict), then per trial any
    number of ``trial_phase`` (``starting``, ``measuring``, ``confirming``,
    with a short detail: a tick, a progress line) and one ``trial_done``
    with the trial's record and the best feasible trial so far (None:
    none yet; ``--levels`` points are trials of their own).  ``note`` is a
    line worth keeping (a stop reason, a space note, a skipped step)."""

    def note(self, text: str) -> None: ...
    def study_started(self, info: JSONObject) -> None: ...
    def trial_phase(self, number: int, phase: str, detail: str) -> None: ...
    def trial_done(self, rec: TrialRecord, best: TrialRecord | None) -> None: ...


class NullReporter:
    """The reporter that says nothing (``tune`` without one)."""

    def note(self, text: str) -> None:
        pass

    def study_started(self, info: JSONObject) -> None:
        pass

    def trial_phase(self, number: int, phase: str, detail: str) -> None:
        pass

    def trial_done(self, rec: TrialRecord, best: TrialRecord | None) -> None:
        pass
