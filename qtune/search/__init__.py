"""The search: the only module that brings host, engine, server, load,
metrics, Optuna and the profile together.

One trial = free port → launch (own process group, log under the study
folder) → ready → warm-up + measured load → stop → record.  What a trial
can teach is always recorded:

- a combination the engine would refuse (``check``) is told as PRUNED
  without a launch (cheap, and TPE learns from pruned trials, not failed);
- a startup failure is PRUNED with its classified reason from the log;
- a measured trial is COMPLETE, with constraints for failed requests and
  each SLO (``trial.set_constraint``: feasible when all ≤ 0), so a trial with
  errors or a missed SLO cannot win;
- only a broken setup (no engine, bad model) stops the study, before any
  trial.

The package by job: ``inputs`` (``prepare``: every input check, before any
file or trial), ``storage`` (storage URLs, journals, the files a study
writes), ``runner`` (``run_study``: baseline, seeds, start design, sampling
loop, confirmation), ``trial`` (one launch and what it teaches), ``result``
(winner, Pareto front, profile, trials table), ``records`` (what a trial
stores: statuses, attribute keys, the writer and readers) and ``reporter``
(progress).  This module only re-exports the public names.
"""

from __future__ import annotations

from qtune.search.confirm import confirm_top
from qtune.search.inputs import Prepared, prepare
from qtune.search.records import TrialRecord, TrialStatus, ran_trials
from qtune.search.reporter import NullReporter, Reporter
from qtune.search.result import (
    TuneResult,
    build_profile,
    estimate_accuracy,
    knee,
    pareto_front,
    trials_frame,
    winner,
)
from qtune.search.runner import run_study, tune
from qtune.search.space import distributions, grid_values, make_sampler
from qtune.search.storage import check_journal, check_storage_url, open_storage

__all__ = ["NullReporter", "Prepared", "Reporter", "TrialRecord", "TrialStatus",
           "TuneResult", "build_profile", "check_journal", "check_storage_url",
           "confirm_top", "distributions", "estimate_accuracy", "grid_values", "knee",
           "make_sampler", "open_storage", "pareto_front", "prepare", "ran_trials",
           "run_study", "trials_frame", "tune", "winner"]
