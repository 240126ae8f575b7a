"""One study, many workers: what a worker on a database server storage
(PostgreSQL, MySQL) does that a single qtune on its journal does not.

Optuna is the distributed engine; qtune adds only what ask/tell needs of it:

- heartbeats: Optuna beats only inside ``Study.optimize``; qtune drives
  ask/tell, so a worker beats its trial from a thread of its own
  (``Heartbeat``) and fails stale trials itself (``reclaim``), whose
  retry callback (``RetryFailedTrialCallback``) queues them again.  Through
  Optuna's gRPC storage proxy (``grpc://``), which has no heartbeat, the
  beat is a counter in the trial's system attributes; a trial asked but
  never beaten (its worker killed in between) is failed too;
- claims: the steps that must happen once per study (the opening: baseline,
  seeds, start design; the finish: confirmation and profile) go to the
  worker whose ``create_study`` of a marker study succeeds, which the
  database makes atomic on the study name;
- the budget: trials launched or running anywhere count, not this process's;
- host facts: every trial records the worker's accelerator and engine, and
  a study refuses a worker whose differ (``check_hosts``);
- ``--gpus``: a worker's own GPUs, locked on the host so that two workers
  never share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import os
import signal
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from qtune.errors import InputError, StudyError, mask_url
from qtune.host import HostFacts
from qtune.host.installed import EngineInstall
from qtune.params import JSONObject
from qtune.search import optuna_api


class FleetAttr:
    """Keys a fleet adds to a trial's and a study's user attributes."""

    # trial
    WORKER = "worker"  # "host:pid" of the worker that ran it
    HOST_FACTS = "host_facts"  # the worker's accelerator and engine
    RETRY_OF = "retry_of"  # the trial a dead worker left, re-run here
    RETRY_REASON = "retry_reason"
    # study
    STUDY_HOST_FACTS = "fleet_host_facts"
    STARTED_AT = "fleet_started_at"  # wall clock: the study-wide time budget
    READY = "fleet_ready"  # the opening (baseline, seeds, design) is done


# Trials last minutes (60-220 s of GPU start alone): a beat a minute, and a
# trial is stale after five missed ones, so a slow database call or a
# paused VM does not fail a live trial.
HEARTBEAT_S = 60
GRACE_BEATS = 5
# A retried trial that kills its worker again is a config problem, not a
# host one: two retries, then it stays failed.
MAX_RETRY = 2


# The trial's own beat through a storage with no heartbeat of Optuna's (the
# gRPC proxy), and on every fleet storage the sign that its worker began
# beating it: [trial id, count].  The id: a retry copies its failed trial's
# system attributes, and a copied beat is not the retry's own.
BEAT = "qtune_beat"


def is_fleet(url: str) -> bool:
    """A database server storage, or Optuna's gRPC proxy of one: the kinds
    several hosts can share (SQLite and the journal are files on one host)."""
    scheme = url.partition("://")[0].partition("+")[0]
    return scheme in ("postgresql", "postgres", "mysql", "grpc")


# What Optuna calls with a trial it failed as stale (RDBStorage's
# heartbeat_stale_trial_callback, failed_trial_callback before Optuna 5).
StaleTrialCallback = Callable[[optuna.Study, FrozenTrial], None]


def retry_callback() -> StaleTrialCallback:
    """Optuna's callback that queues a failed stale trial again."""
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
        or optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental in some 4.x releases
        callback: StaleTrialCallback = retry(max_retry=MAX_RETRY)
        return callback


def storage_kwargs(heartbeat_s: int) -> dict[str, int | StaleTrialCallback]:
    """RDBStorage's heartbeat arguments for a fleet study."""
    # Optuna 5 renamed the argument (the old name warns); 4.x knows only it.
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    key = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params
           else "failed_trial_callback")
    return {"heartbeat_interval": heartbeat_s, "grace_period": heartbeat_s * GRACE_BEATS,
            key: retry_callback()}


def parse_grpc_url(url: str) -> tuple[str, int]:
    """``grpc://host:port`` (Optuna's storage proxy, ``qtune storage-proxy``)
    as its host and port.  The URL is never echoed: the proxy has no login,
    and a user:password in it is a mistake that may hold a real secret."""
    from urllib.parse import urlsplit

    hint = "e.g. --storage grpc://proxy.lan:13000 (the host and port of qtune storage-proxy)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InputError("--storage grpc://: not a host:port", hint=hint) from None
    if parts.scheme != "grpc":
        raise InputError("--storage: not a grpc:// URL", hint=hint)
    if "@" in parts.netloc:
        raise InputError("--storage grpc://: the proxy takes no user or password in "
                         "its URL", hint="the database's password stays with qtune "
                         "storage-proxy; " + hint)
    if not parts.hostname or port is None or not 1 <= port <= 65535 \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InputError("--storage grpc://: not a host:port", hint=hint)
    return parts.hostname, port


def quiet_heartbeat_warning() -> None:
    # Optuna warns at every ask() that its heartbeat is meant for optimize();
    # a worker runs the beat itself (Heartbeat).
    warnings.filterwarnings("ignore", message="Heartbeat of storage")


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def host_facts(host: HostFacts, install: EngineInstall) -> dict[str, str]:
    """What a trial's numbers depend on beyond its config: the accelerator
    (GPU model and count, or the CPU model and its CPUs) and the engine."""
    names = sorted({g.name for g in host.gpus})
    if names:
        accel = f"{len(host.gpus)}x {' + '.join(names)}"
    else:
        accel = f"cpu {host.cpu.model} ({len(host.usable_cpus)} CPUs)"
    return {"accelerator": accel,
            "engine": f"{install.name} {install.version} ({install.build})"}


def check_hosts(study: optuna.Study, facts: dict[str, str], allow_mixed: bool,
                name: str) -> None:
    """Refuse a worker whose host facts differ from the study's: its
    trials would be compared with trials measured on other hardware or
    another engine.  The first worker's facts are the study's."""
    stored = study.user_attrs.get(FleetAttr.STUDY_HOST_FACTS)
    if not isinstance(stored, dict):
        study.set_user_attr(FleetAttr.STUDY_HOST_FACTS, facts)
        return
    diff = [f"{k} {stored.get(k)!r} here {facts[k]!r}" for k in sorted(facts)
            if stored.get(k) != facts[k]]
    if diff and not allow_mixed:
        raise StudyError(
            f"study {name} was measured with other host facts ("
            + "; ".join(d.replace(" here ", ", this worker has ", 1) for d in diff)
            + "): its trials would not compare with this worker's",
            hint="run this worker on a host like the study's, use a new --study, or "
            "pass --allow-mixed-hosts to mix them knowingly")


def trial_attrs(facts: dict[str, str]) -> JSONObject:
    return {FleetAttr.WORKER: worker_id(), FleetAttr.HOST_FACTS: facts}


def note_retry(study: optuna.Study, trial: optuna.Trial, grace_s: int) -> str | None:
    """A trial re-queued because its worker died: record which trial it
    re-runs and why that one failed; the note for the reporter."""
    retry_of = optuna_api.frozen(study, trial).system_attrs.get("failed_trial")
    if retry_of is None:
        return None
    dead = optuna_api.trial_by_number(study, retry_of)
    beat = dead.system_attrs.get(BEAT)
    if isinstance(beat, list) and beat[:1] == [optuna_api.trial_id(dead)]:
        who = dead.user_attrs.get(FleetAttr.WORKER, "a worker")
        why = (f"worker {who} stopped beating (no heartbeat for {grace_s} s): killed, "
               "or cut off from the database")
    else:
        why = (f"its worker never beat it (no heartbeat {grace_s} s after it was "
               "asked for): killed before its first heartbeat")
    trial.set_user_attr(FleetAttr.RETRY_OF, retry_of)
    trial.set_user_attr(FleetAttr.RETRY_REASON, why)
    return f"re-runs trial {retry_of}: {why}"


# (storage, trial id) -> (its beat, when this process first saw that beat):
# a beat is stale when it has not moved for a grace period of this
# process's own clock, so hosts' clocks need not agree.
_SEEN: dict[tuple[int, int], tuple[Any, float]] = {}
_clock = time.monotonic  # (a test's clock)


def reclaim(study: optuna.Study, heartbeat_s: int) -> None:
    """Fail the trials of workers that stopped beating, or never began
    (killed between ``ask`` and the first beat); the retry callback queues
    each again.  On RDB storage Optuna's heartbeat judges a trial once its
    worker beat it; otherwise (the gRPC proxy, a trial never beaten) a beat
    that has not moved for the grace period, as this worker saw it, is stale."""
    storage: Any = optuna_api.storage_of(study)
    # Never through the gRPC proxy.
    optuna_beats = optuna_api.heartbeat_enabled(storage)
    if optuna_beats:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.fail_stale_trials(study)
    grace = heartbeat_s * GRACE_BEATS
    now = _clock()
    live: set[tuple[int, int]] = set()
    stale: list[int] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = t.system_attrs.get(BEAT)
        tid = optuna_api.trial_id(t)
        mine = beat if isinstance(beat, list) and beat[:1] == [tid] else None
        if optuna_beats and mine is not None:
            continue  # beaten: Optuna's heartbeat judges it
        key = (id(storage), tid)
        live.add(key)
        seen = _SEEN.get(key)
        if seen is None or seen[0] != mine:
            _SEEN[key] = (mine, now)
        elif now - seen[1] > grace:
            stale.append(tid)
    for key in [k for k in _SEEN if k[0] == id(storage) and k not in live]:
        del _SEEN[key]
    callback = storage.get_heartbeat_stale_trial_callback() if optuna_beats \
        else retry_callback()
    for trial_id in stale:
        try:
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker failed it first: its callback queued it
        if callback is not None:
            callback(study, storage.get_trial(trial_id))


def running(study: optuna.Study, before: int | None = None) -> int:
    """Trials running anywhere (with ``before``: those numbered lower)."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
               if before is None or t.number < before)


def claim(study: optuna.Study, what: str) -> bool:
    """Whether this worker is the one to do ``what`` for the study: the
    first to create the marker study of that name (atomic in the database).
    '~' is outside --study's alphabet: no user's study can take the name."""
    name = f"{study.study_name}~{what}"
    try:
        optuna.create_study(study_name=name, storage=optuna_api.storage_of(study))
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def started_at(study: optuna.Study) -> float:
    """The study's start, as a time.monotonic() of this process (the study
    keeps the wall clock; hosts' clocks are assumed close)."""
    wall = study.user_attrs.get(FleetAttr.STARTED_AT)
    if not isinstance(wall, (int, float)):
        wall = time.time()
        study.set_user_attr(FleetAttr.STARTED_AT, wall)
    return time.monotonic() - (time.time() - float(wall))


class Heartbeat:
    """Beat a running trial from a thread: Optuna's heartbeat on RDB
    storage, the ``BEAT`` counter through the gRPC proxy.  A database that
    stays out of reach for half the grace period (other workers would fail
    the trial soon after) is lost: the main thread is interrupted (SIGINT,
    which unwinds through the server's ``with`` and stops it) and ``lost``
    says why, for the one error line."""

    def __init__(self, storage: Any, trial_id: int, interval: float, grace: float) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.interval, self.grace = interval, grace
        self.lost: str | None = None
        self._optuna = optuna_api.heartbeat_enabled(storage)
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="qtune-heartbeat")

    def beat(self) -> None:
        if self._optuna:
            self.storage.record_heartbeat(self.trial_id)
            if self._count:
                return
        self._count += 1
        self.storage.set_trial_system_attr(self.trial_id, BEAT,
                                           [self.trial_id, self._count])

    def __enter__(self) -> Heartbeat:
        self.beat()  # at once: the trial is judged by its beats from here on
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        ok_at = time.monotonic()
        while not self._stop.wait(min(self.interval, self.grace / 4)):
            try:
                self.beat()
                ok_at = time.monotonic()
            except Exception as exc:  # the driver's errors vary
                if time.monotonic() - ok_at > self.grace / 2:
                    self.lost = f"no heartbeat reached it for {time.monotonic() - ok_at:.0f} s " \
                        f"({describe_error(exc)[:200]})"
                    _LOST.append(self.lost)
                    os.kill(os.getpid(), signal.SIGINT)
                    return


def rpc_errors() -> tuple[type[BaseException], ...]:
    """The gRPC proxy's errors (a proxy out of reach), when grpc is installed."""
    try:
        import grpc
    except ImportError:
        return ()
    return (grpc.RpcError,)


def describe_error(exc: BaseException) -> str:
    """A storage error in one line: a gRPC error's first line says only
    that an RPC ended; its code and details say why."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{type(exc).__name__}: {getattr(code(), 'name', code())}: {details()}"
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


_LOST: list[str] = []  # why the database was lost (set by a Heartbeat)


@contextlib.contextmanager
def beating(study: optuna.Study, trial: optuna.Trial, heartbeat_s: int) -> Iterator[None]:
    with Heartbeat(optuna_api.storage_of(study), optuna_api.trial_id(trial), heartbeat_s,
                   heartbeat_s * GRACE_BEATS):
        yield


def lost_reason() -> str | None:
    return _LOST[-1] if _LOST else None


def lost_database(url: str, detail: str) -> StudyError:
    return StudyError(
        f"lost the study's database {mask_url(url)}: {detail}; this worker's server "
        "is stopped",
        hint="start this worker again once the database answers: it rejoins the study, "
        "and its unfinished trial is re-queued once its heartbeat is stale")


# -- GPUs --------------------------------------------------------------------

_HELD: list[Any] = []  # open lock files: held for the worker's life


def pin_gpus(host: HostFacts, spec: str | None) -> HostFacts:
    """``--gpus 0,1`` (indices; one index: ``--gpus 1,``) or ``--gpus 2`` (a
    count of free ones): lock
    them on this host for this worker's life, make them the only ones its
    servers see (CUDA_VISIBLE_DEVICES, which every launch inherits) and the
    only ones the space is built for."""
    import dataclasses

    if spec is None:
        return host
    if not host.gpus:
        raise InputError("--gpus: this host has no NVIDIA GPU",
                         hint="leave --gpus out on a CPU host")
    by_index = {g.index: g for g in host.gpus}
    wanted: list[int] | None = None
    count = None
    text = spec.strip()
    if "," in text or not text.isdigit():
        try:
            wanted = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--gpus {spec!r}: not a GPU list or count",
                             hint="e.g. --gpus 0,1 (indices) or --gpus 2 (a count)") from None
        unknown = [i for i in wanted if i not in by_index]
        if unknown or not wanted or len(set(wanted)) != len(wanted):
            raise InputError(f"--gpus {spec}: GPUs of this host are "
                             + ",".join(map(str, sorted(by_index))),
                             hint="name each GPU once, by its nvidia-smi index")
    else:
        count = int(text)
        if not 1 <= count <= len(host.gpus):
            raise InputError(f"--gpus {count}: this host has {len(host.gpus)} GPUs",
                             hint=f"ask for 1 to {len(host.gpus)}")
    got: list[int] = []
    for idx in (wanted if wanted is not None else sorted(by_index)):
        if count is not None and len(got) == count:
            break
        if _lock_gpu(by_index[idx].uuid or str(idx)):
            got.append(idx)
        elif wanted is not None:
            raise InputError(f"--gpus: GPU {idx} is held by another qtune worker on "
                             "this host", hint="give each worker its own GPUs")
    if count is not None and len(got) < count:
        raise InputError(f"--gpus {count}: only {len(got)} GPUs are free of other "
                         "qtune workers on this host", hint="ask for fewer, or wait")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(by_index[i].uuid or str(i) for i in got)
    gpu = dataclasses.replace(host.gpu, gpus=[by_index[i] for i in got])
    return dataclasses.replace(host, gpu=gpu)


def _lock_gpu(key: str) -> bool:
    """A per-GPU lock file under the temp dir, held until this process ends
    (the kernel drops it then, even on SIGKILL)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in key)
    path = Path(tempfile.gettempdir()) / f"qtune-gpu-{safe}.lock"
    f = open(path, "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _HELD.append(f)
    return True
