"""Who else works on a study, as one object the runner asks instead of
testing "is this a fleet?" at each step: ``OneHost`` (journal or SQLite
storage: this process is the only worker) or ``Fleet`` (a database server
or the gRPC proxy: workers on several hosts share the study,
``qtune.search.fleet``).  The trial lifecycle (``qtune.search.trial``) is
the same under both; they differ in when the study started, who opens and
who finishes it, how many trials are taken, and what a trial left RUNNING
means."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from qtune.errors import StudyError
from qtune.search import fleet, optuna_api
from qtune.search.inputs import Prepared
from qtune.search.records import LAUNCHED, Attr
from qtune.search.reporter import Reporter


def launched_count(study: optuna.Study) -> int:
    """Trials that launched a server (the count --trials limits)."""
    return sum(
        1 for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(Attr.STATUS) in LAUNCHED
        and Attr.SERVER_OF not in t.user_attrs  # --levels: no launch of its own
    )


class OneHost:
    """This process alone runs the study: it opens it (the engine defaults,
    the start design), takes every trial and finishes it."""

    heartbeat_s: int | None = None
    joins = False  # create_study resumes a study of that name

    def __init__(self, prep: Prepared) -> None:
        self.prep = prep

    def started(self, study: optuna.Study) -> float:
        return time.monotonic()

    def tidy(self, study: optuna.Study) -> None:
        """Journal storage has no heartbeat: trials left RUNNING by a killed
        qtune would bias the constant-liar sampler forever.  Fail them on
        resume."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(t.number, state=TrialState.FAIL)

    def wait_for_opening(self, study: optuna.Study, reporter: Reporter) -> bool:
        return True  # (never asked: this process opens its study)

    def opened(self, study: optuna.Study) -> None:
        pass

    def taken(self, study: optuna.Study) -> bool:
        """Whether the trials left are taken by other workers' running ones."""
        return False

    def asked_past_budget(self, study: optuna.Study, trial: optuna.Trial) -> bool:
        return False

    @contextlib.contextmanager
    def running(self, study: optuna.Study, trial: optuna.Trial,
                reporter: Reporter) -> Iterator[None]:
        """While ``trial`` runs: this host's facts on it."""
        for k, v in _host_attrs(self.prep).items():
            trial.set_user_attr(k, v)
        yield

    def claim_finish(self, study: optuna.Study, reporter: Reporter) -> bool:
        return True

    def lost(self, exc: BaseException) -> StudyError | None:
        """The one error a lost storage becomes (None: not such a loss)."""
        return None


class Fleet(OneHost):
    """Workers on several hosts share the study through a database: the one
    whose create_study made it opens it (or one that finds its opener dead),
    each beats the trials it runs, a dead worker's trial is run again, and
    the first to claim it finishes the study once no trial runs."""

    joins = True  # another worker may have made the study: join it

    def __init__(self, prep: Prepared) -> None:
        super().__init__(prep)
        self.heartbeat_s = prep.cfg.fleet.heartbeat_s

    @property
    def _beat_s(self) -> int:
        return self.prep.cfg.fleet.heartbeat_s

    def started(self, study: optuna.Study) -> float:
        return fleet.started_at(study)

    def tidy(self, study: optuna.Study) -> None:
        # Other workers' trials are RUNNING too: only the stale ones fail.
        fleet.reclaim(study, self._beat_s)

    def wait_for_opening(self, study: optuna.Study, reporter: Reporter) -> bool:
        """A worker that joins a study being opened waits for the baseline
        and the start design (its space is shaped by the baseline).  When
        the opener died first (nothing has run for a grace period), one
        waiting worker takes the opening over; returns whether this one did."""
        if study.user_attrs.get(fleet.FleetAttr.READY) is not None:
            return False  # opened already: its space is shaped
        reporter.note("waiting for the study's opening (engine defaults, start design) "
                      "by the worker that created it")
        grace = self._beat_s * fleet.GRACE_BEATS
        idle_since = time.monotonic()
        while study.user_attrs.get(fleet.FleetAttr.READY) is None:
            fleet.reclaim(study, self._beat_s)
            if fleet.running(study):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > grace and \
                    fleet.claim(study, f"open-{len(study.get_trials(deepcopy=False))}"):
                reporter.note("the worker that opened the study is gone: this one "
                              "completes the opening")
                return True
            time.sleep(min(5.0, self._beat_s / 2))
        return False

    def opened(self, study: optuna.Study) -> None:
        study.set_user_attr(fleet.FleetAttr.READY, fleet.worker_id())

    def taken(self, study: optuna.Study) -> bool:
        fleet.reclaim(study, self._beat_s)
        if launched_count(study) + fleet.running(study) >= self.prep.cfg.trials:
            # The budget is taken by other workers' running trials: wait
            # for them (one may die, and its trial come back queued).
            time.sleep(min(5.0, self._beat_s / 2))
            return True
        return False

    def asked_past_budget(self, study: optuna.Study, trial: optuna.Trial) -> bool:
        """Two workers asked at once past the study-wide budget: the later
        trial is closed unrun (its queued point queued again)."""
        if launched_count(study) + fleet.running(study, before=trial.number) \
                < self.prep.cfg.trials:
            return False
        frozen = optuna_api.frozen(study, trial)
        queued = "fixed_params" in frozen.system_attrs or "failed_trial" in frozen.system_attrs
        study.tell(trial, state=TrialState.FAIL)
        if queued:
            keep = {k: v for k, v in frozen.user_attrs.items()
                    if k not in (fleet.FleetAttr.WORKER, fleet.FleetAttr.HOST_FACTS)}
            study.enqueue_trial(dict(frozen.params), user_attrs=keep)
        return True

    @contextlib.contextmanager
    def running(self, study: optuna.Study, trial: optuna.Trial,
                reporter: Reporter) -> Iterator[None]:
        """While ``trial`` runs: beaten, the first beat before anything else
        (the window in which a killed worker leaves a trial never beaten,
        which fleet.reclaim fails, stays short); which dead worker's trial
        it re-runs, noted."""
        with fleet.beating(study, trial, self._beat_s):
            for k, v in _host_attrs(self.prep).items():
                trial.set_user_attr(k, v)
            note = fleet.note_retry(study, trial, self._beat_s * fleet.GRACE_BEATS)
            if note:
                reporter.note(f"trial {trial.number} {note}")
            yield

    def claim_finish(self, study: optuna.Study, reporter: Reporter) -> bool:
        """Whether this worker runs the confirmation and writes the profile:
        once every running trial has ended, the first to claim it."""
        while fleet.running(study):
            fleet.reclaim(study, self._beat_s)
            if not fleet.running(study):
                break
            time.sleep(min(5.0, self._beat_s / 2))
        if fleet.claim(study, f"finish-{launched_count(study)}"):
            return True
        reporter.note("another worker confirms the top configs and writes the profile "
                      f"(or run: qtune search --study {self.prep.study_name} --finish)")
        return False

    def lost(self, exc: BaseException) -> StudyError | None:
        """A database's errors, or (through the proxy) gRPC's: the database is
        lost, which stops this worker with one error."""
        if isinstance(exc, KeyboardInterrupt):
            why = fleet.lost_reason()
            return fleet.lost_database(self.prep.storage_url, why) if why else None
        storage_errors = (optuna.exceptions.StorageInternalError, SQLAlchemyError,
                          *fleet.rpc_errors())
        if not isinstance(exc, storage_errors):
            return None
        cause = exc.__cause__ or exc
        return fleet.lost_database(self.prep.storage_url,
                                   fleet.describe_error(cause)[:250])


def _host_attrs(prep: Prepared) -> dict[str, Any]:
    return fleet.trial_attrs(fleet.host_facts(prep.host, prep.ctx.install))


def coordination(prep: Prepared) -> OneHost:
    """The study's workers: a fleet on a database server's storage."""
    return Fleet(prep) if fleet.is_fleet(prep.storage_url) else OneHost(prep)
