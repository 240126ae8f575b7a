"""The fleet's pieces without a database server: which storages are a
fleet's, the host facts a study refuses to mix, a worker's own GPUs, the
stale trials a worker fails (never beaten; through the gRPC proxy), and
the storage URLs that are printed."""

from __future__ import annotations

import json
import sys

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.engines import probe_host as probe
from qtune.errors import InputError, StudyError, mask_url
from qtune.host.installed import EngineInstall
from qtune.search import fleet, optuna_api
from tests.conftest import FIX
from tests.fakes.nvml import ReplayNVML

VLLM = EngineInstall("vllm", "0.32.0", "cuda", sys.executable)


@pytest.fixture
def h200x2():
    nvml = ReplayNVML(json.loads((FIX / "hosts" / "h200x2" / "nvml.json").read_text()))
    return probe(root=FIX / "hosts" / "h200x2", nvml=nvml, engine_python=sys.executable)


@pytest.fixture
def gpu_locks(tmp_path, monkeypatch):
    """GPU locks in a folder of the test's own, released after it."""
    monkeypatch.setattr(fleet.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
    for f in fleet._HELD:
        f.close()
    fleet._HELD.clear()


@pytest.mark.parametrize(("url", "shared"), [
    ("postgresql://u@db/x", True), ("postgresql+psycopg://u@db/x", True),
    ("mysql://u@db/x", True), ("sqlite:///studies/x.db", False),
    ("journal:///tmp/x.log", False)])
def test_only_a_database_server_makes_a_fleet(url, shared):
    assert fleet.is_fleet(url) is shared


def test_a_study_refuses_a_worker_with_other_gpus_unless_allowed(h200x2, cpu_host):
    study = optuna.create_study()
    gpu = fleet.host_facts(h200x2, VLLM)
    assert gpu["accelerator"] == "2x NVIDIA H200"
    fleet.check_hosts(study, gpu, False, "s")  # the first worker's facts are the study's
    fleet.check_hosts(study, gpu, False, "s")
    cpu = fleet.host_facts(cpu_host, EngineInstall("vllm", "0.32.0", "cpu", "python"))
    with pytest.raises(StudyError, match=r"accelerator '2x NVIDIA H200', this worker has "
                       r"'cpu .*engine 'vllm 0.32.0 \(cuda\)', this worker has "
                       r"'vllm 0.32.0 \(cpu\)'") as exc:
        fleet.check_hosts(study, cpu, False, "s")
    assert "--allow-mixed-hosts" in (exc.value.hint or "")
    fleet.check_hosts(study, cpu, True, "s")
    newer = fleet.host_facts(h200x2, EngineInstall("vllm", "0.33.0", "cuda", "python"))
    with pytest.raises(StudyError, match="engine 'vllm 0.32.0"):
        fleet.check_hosts(study, newer, False, "s")


def test_gpus_by_count_take_the_ones_no_other_worker_holds(h200x2, gpu_locks):
    first = fleet.pin_gpus(h200x2, "1")
    uuids = [g.uuid for g in h200x2.gpus]
    assert [g.uuid for g in first.gpus] == uuids[:1]
    assert fleet.os.environ["CUDA_VISIBLE_DEVICES"] == uuids[0]
    # A second worker on the host (a lock file opened again: another holder).
    second = fleet.pin_gpus(h200x2, "1")
    assert [g.uuid for g in second.gpus] == uuids[1:]
    with pytest.raises(InputError, match="only 0 GPUs are free"):
        fleet.pin_gpus(h200x2, "1")


def test_gpus_by_index_refuse_a_held_or_unknown_gpu(h200x2, gpu_locks):
    assert [g.index for g in fleet.pin_gpus(h200x2, "1,").gpus] == [1]
    with pytest.raises(InputError, match="GPU 1 is held by another qtune worker"):
        fleet.pin_gpus(h200x2, "0,1")
    with pytest.raises(InputError, match="GPUs of this host are 0,1"):
        fleet.pin_gpus(h200x2, "2,3")
    with pytest.raises(InputError, match="this host has 2 GPUs"):
        fleet.pin_gpus(h200x2, "3")


def test_gpus_on_a_cpu_host_is_refused(cpu_host, gpu_locks):
    assert fleet.pin_gpus(cpu_host, None) is cpu_host
    with pytest.raises(InputError, match="no NVIDIA GPU"):
        fleet.pin_gpus(cpu_host, "1")


class Clock:
    """reclaim's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(fleet, "_clock", c)
    return c


def _retries(study, number):
    return [t for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))
            if t.system_attrs.get("failed_trial") == number]


def test_a_trial_asked_but_never_beaten_is_failed_and_queued_again(tmp_path, clock):
    """A worker killed between ask() and its first heartbeat leaves a
    RUNNING trial Optuna's heartbeat never judges (it has no beat): it
    blocked the finish for ever.  Beaten trials stay Optuna's to judge."""
    from qtune.search.storage import open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}", heartbeat_s=1)
    study = optuna.create_study(storage=storage)
    orphan = study.ask()
    live = study.ask()
    beat = fleet.Heartbeat(study._storage, live._trial_id, 1, 5)
    beat.beat()
    fleet.reclaim(study, 1)  # first seen
    clock.now += 4.9
    fleet.reclaim(study, 1)
    assert fleet.running(study) == 2  # within the grace (5 beats of 1 s)
    clock.now += 0.2
    beat.beat()
    fleet.reclaim(study, 1)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[orphan.number] == optuna.trial.TrialState.FAIL
    assert states[live.number] == optuna.trial.TrialState.RUNNING
    assert len(_retries(study, orphan.number)) == 1
    fleet.reclaim(study, 1)  # failed once, queued once
    assert len(_retries(study, orphan.number)) == 1


@pytest.fixture
def proxy(tmp_path):
    """Optuna's gRPC proxy in this process, over an SQLite file."""
    from concurrent.futures import ThreadPoolExecutor

    from optuna.storages._grpc.server import make_server

    from tests.fleet.conftest import _free_port

    port = _free_port()
    backend = optuna.storages.get_storage(f"sqlite:///{tmp_path / 'p.db'}")
    server = make_server(backend, "127.0.0.1", port, ThreadPoolExecutor(4))
    server.start()
    yield f"grpc://127.0.0.1:{port}"
    server.stop(grace=None)


def test_through_the_proxy_a_trial_whose_beat_stops_is_failed_and_queued(proxy, clock):
    """The gRPC proxy has no heartbeat of Optuna's: the beat is a counter
    on the trial, stale when it has not moved for the grace period."""
    from qtune.search.storage import open_storage

    storage = open_storage(proxy, heartbeat_s=1)
    assert not optuna_api.heartbeat_enabled(storage)
    study = optuna.create_study(storage=storage, study_name="p")
    dies, lives = study.ask(), study.ask()
    beats = [fleet.Heartbeat(study._storage, t._trial_id, 1, 5) for t in (dies, lives)]
    for b in beats:
        b.beat()
    fleet.reclaim(study, 1)
    for _ in range(3):
        clock.now += 3
        beats[1].beat()  # only this worker still beats
        fleet.reclaim(study, 1)
    trials = optuna.load_study(study_name="p", storage=open_storage(proxy)).trials
    assert trials[dies.number].state == optuna.trial.TrialState.FAIL
    assert trials[lives.number].state == optuna.trial.TrialState.RUNNING
    assert trials[lives.number].system_attrs[fleet.BEAT] == [lives._trial_id, 4]
    assert len(_retries(study, dies.number)) == 1
    # A retry carries its failed trial's beat, which is not its own: a
    # worker that dies before beating the retry leaves it stale too.
    queued = _retries(study, dies.number)[0].number
    retry = study.ask()
    assert retry.number == queued
    fleet.reclaim(study, 1)
    clock.now += 6
    fleet.reclaim(study, 1)
    assert study._storage.get_trial(retry._trial_id).state == optuna.trial.TrialState.FAIL


def test_a_proxy_that_does_not_answer_is_one_error(monkeypatch):
    from qtune.search import storage
    from tests.fleet.conftest import _free_port

    monkeypatch.setattr(storage, "PROXY_WAIT_S", 0.5)
    port = _free_port()
    with pytest.raises(StudyError, match=rf"no storage proxy answers at grpc://127.0.0.1:{port}"):
        storage.open_storage(f"grpc://127.0.0.1:{port}")


@pytest.mark.parametrize(("url", "why"), [
    ("grpc://h", "not a host:port"), ("grpc://h:0", "not a host:port"),
    ("grpc://h:99999", "not a host:port"), ("grpc://h:13000/db", "not a host:port"),
    ("grpc://u:pw@h:13000", "no user or password")])
def test_a_grpc_url_is_a_host_and_port(url, why):
    with pytest.raises(InputError, match=why) as exc:
        fleet.parse_grpc_url(url)
    assert "pw" not in str(exc.value) + (exc.value.hint or "")
    assert fleet.parse_grpc_url("grpc://proxy.lan:13000") == ("proxy.lan", 13000)
    assert fleet.is_fleet("grpc://proxy.lan:13000")


_SECRET = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                  max_size=24).map(lambda s: "Zq9" + s)


@settings(max_examples=300, deadline=None)
@given(user=st.text(st.characters(codec="ascii", categories=("L", "N")), max_size=6),
       secret=_SECRET,
       scheme=st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "grpc"]),
       rest=st.sampled_from(["h/db", "h:5432/db", "h:5x/db", "[::1]:5432/db", "h", ""]))
def test_a_password_in_a_storage_url_is_never_shown(user, secret, scheme, rest):
    """Whatever the password holds ('/', '[', spaces, an '@': SQLAlchemy
    still connects with some), neither the printed URL nor a refusal of
    a proxy URL shows it."""
    url = f"{scheme}://{user}:{secret}@{rest}"
    assert secret not in mask_url(url)
    if scheme == "grpc":
        with pytest.raises(InputError) as exc:
            fleet.parse_grpc_url(url)
        assert secret not in str(exc.value) + (exc.value.hint or "")
