"""The one place qtune reaches into Optuna's private API (issue 30): what
the fleet, the runner and the storage proxy need that Optuna does not
publish (a trial's storage id, a study's storage, the heartbeat test, the
gRPC proxy's server factory).  Each is checked against the Optuna range
``pyproject.toml`` declares (5.0.0 and 5.x): the fast tier runs at both ends
(``scripts/floors.sh``).  Nothing else in qtune names ``_storage``,
``_trial_id``, ``_study_id`` or ``optuna.storages._*``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial


class ProxyServer(Protocol):
    """What ``qtune storage-proxy`` uses of the ``grpc.Server`` Optuna
    makes (grpc ships no types)."""

    def start(self) -> None: ...
    def wait_for_termination(self, timeout: float | None = None) -> bool: ...
    def stop(self, grace: float | None) -> threading.Event: ...


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (Optuna keeps it private)."""
    storage: BaseStorage = study._storage
    return storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (unique across studies; the number is
    unique only within one)."""
    return int(trial._trial_id)


def frozen(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    """A live trial as stored now, system attributes included (the ones
    ``enqueue_trial`` and the retry callback set)."""
    return storage_of(study).get_trial(trial_id(trial))


def trial_by_number(study: optuna.Study, number: int) -> FrozenTrial:
    storage = storage_of(study)
    return storage.get_trial(
        storage.get_trial_id_from_study_id_trial_number(study._study_id, number))


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether Optuna's own heartbeat runs on ``storage`` (RDB storage
    opened with it, bare or in the cache a Study wraps it in)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return bool(is_heartbeat_enabled(storage))


def grpc_server(storage: BaseStorage, host: str, port: int, threads: int) -> ProxyServer:
    """Optuna's gRPC storage proxy server, not started (``run_grpc_proxy_server``,
    the public form, blocks and cannot say when it is listening).  Raises
    ImportError without grpcio."""
    from optuna.storages._grpc.server import make_server

    server: ProxyServer = make_server(storage, host, port,
                                      ThreadPoolExecutor(max_workers=threads))
    return server


def name_values(study: optuna.Study, names: list[str]) -> None:
    """Label the study's values (optuna-dashboard's axes, ``trials_dataframe``'s
    columns): ``set_metric_names`` is public but marked experimental since
    3.2, and its warning would reach the user's terminal at every run."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(names)
