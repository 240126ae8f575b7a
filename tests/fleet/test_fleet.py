"""The fleet's pieces without a database: which storages are a fleet's,
the host facts a study refuses to mix, and a worker's own GPUs."""

from __future__ import annotations

import json
import sys

import optuna
import pytest

from qtune.errors import InputError, StudyError
from qtune.host import probe
from qtune.host.installed import EngineInstall
from qtune.search import fleet
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
