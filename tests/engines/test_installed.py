"""The probe finds the TGI launcher and says what else TGI needs to start."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from qtune.engines import ENGINES, find_engines
from qtune.host import findings


def _program(folder, name, text=""):
    folder.mkdir(exist_ok=True)
    p = folder / name
    p.write_text(f"#!/bin/sh\necho '{text}'\n")
    p.chmod(0o755)
    return p


def test_a_launcher_without_its_shard_server_is_found_and_said_incomplete(
        tmp_path, monkeypatch, cpu_host):
    bin_ = tmp_path / "bin"
    launcher = _program(bin_, "text-generation-launcher", "text-generation-launcher 3.3.7")
    monkeypatch.setenv("PATH", str(bin_))
    found = find_engines(sys.executable)
    tgi = found.get("tgi")
    assert tgi is not None and tgi.version == "3.3.7" and tgi.build == "cuda"
    assert tgi.location == str(launcher) and tgi.python is None
    (note,) = found.notes
    assert "text-generation-server and text-generation-router not on PATH" in note
    facts = dataclasses.replace(cpu_host, engines=found)
    (f,) = [f for f in findings(facts) if f.id == "engine-incomplete"]
    assert f.severity == "warning" and "TGI cannot start" in f.seen
    assert facts.to_dict()["engines"]["notes"] == [note]

    _program(bin_, "text-generation-server")
    _program(bin_, "text-generation-router")
    assert find_engines(sys.executable).notes == []


def test_an_engine_installed_with_pip_target_carries_its_pythonpath(tmp_path, monkeypatch):
    """SGLang installed with `pip install --target DIR` (as on the H200, whose
    image lacks it) is found through PYTHONPATH; its servers, profiles and
    units must carry that PYTHONPATH, as vLLM's already did."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang-0.5.17.dist-info").mkdir()
    (site / "sglang-0.5.17.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n")
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{other}:{site}")
    sg = find_engines(sys.executable).get("sglang")
    assert sg is not None and sg.version == "0.5.17"
    assert sg.location == str(site / "sglang" / "__init__.py")
    assert sg.pythonpath == f"{other}:{site}"


def _python_seeing(folder, site):
    """A Python whose environment holds ``site`` (as a venv of its own would)."""
    py = folder / "python"
    folder.mkdir(parents=True, exist_ok=True)
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return py


def _fake_dist(site, name, version):
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    (site / f"{name}-{version}.dist-info").mkdir()
    (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_each_engine_from_its_own_python(tmp_path, monkeypatch):
    """vLLM and SGLang pin different torch builds, so they live in separate
    environments: `--engine-python vllm=A,sglang=B` takes each from its own."""
    from qtune.host.installed import find_engines_for as find

    def find_engines_for(spec, default):
        return find(spec, default, tuple(ENGINES.values()))

    monkeypatch.delenv("PYTHONPATH", raising=False)
    _fake_dist(tmp_path / "site-v", "vllm", "0.26.0")
    _fake_dist(tmp_path / "site-s", "sglang", "0.5.17")
    py_v = _python_seeing(tmp_path / "env-v", tmp_path / "site-v")
    py_s = _python_seeing(tmp_path / "env-s", tmp_path / "site-s")
    found = find_engines_for(f"vllm={py_v},sglang={py_s}", sys.executable)
    by = {e.name: e for e in found.engines}
    assert by["vllm"].version == "0.26.0" and by["vllm"].python == str(py_v)
    assert by["sglang"].version == "0.5.17" and by["sglang"].python == str(py_s)
    assert found.python == f"vllm={py_v}, sglang={py_s}" and found.error is None
    # an engine in the other's Python is not taken from there
    found = find_engines_for(f"sglang={py_v}", sys.executable)
    assert found.get("sglang") is None
    # one Python for all: as before
    assert find_engines_for(str(py_s), sys.executable).get("sglang").python == str(py_s)


@pytest.mark.parametrize("spec,said", [
    ("tgi=/x", "tgi is found on PATH"),
    ("trtllm=/x", "unknown engine 'trtllm'"),
    ("vllm=/a,vllm=/b", "vllm named twice"),
    ("vllm=/a,/b", "'/b' is not NAME=PATH"),
    ("sglang=", "'sglang=' is not NAME=PATH"),
])
def test_a_bad_engine_python_is_refused_before_anything_runs(spec, said):
    from qtune.errors import InputError
    from qtune.host.installed import parse_engine_pythons

    with pytest.raises(InputError, match=re.escape(said)):
        parse_engine_pythons(spec, tuple(ENGINES.values()))


def test_transformers_is_found_by_its_package_with_torch_s_build(tmp_path, monkeypatch):
    """`transformers serve` is in the transformers package (which comes with
    vLLM): found like vLLM and SGLang, its build the installed torch's."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    _fake_dist(tmp_path / "site", "transformers", "9.9.0")
    py = _python_seeing(tmp_path / "env", tmp_path / "site")
    tf = find_engines(str(py)).get("transformers")
    assert tf is not None and tf.version == "9.9.0" and tf.python == str(py)
    assert tf.build in ("cpu", "cuda", "rocm")


def test_an_engine_says_its_own_findings_about_the_host(cpu_host):
    """The host knows no engine by name (issue 30): vLLM's own findings (a
    build that does not match the hardware, tcmalloc for its CPU backend)
    come from its adapter, and ``probe_host`` adds them to the host's."""
    from qtune.engines import probe_host
    from qtune.host import probe as hardware_only
    from qtune.host.installed import EngineInstall, InstalledEngines
    from tests.conftest import FIX
    from tests.fakes.nvml import NoNVML

    vllm = ENGINES["vllm"]
    cuda = dataclasses.replace(cpu_host, engines=InstalledEngines(
        sys.executable, [EngineInstall("vllm", "0.26.0", "cuda", sys.executable)]),
        allocators={})
    # (this fixture's NUMA node reports less memory than the host: a VM)
    assert [f.id for f in vllm.host_findings(cuda)] == ["vllm-cuda-no-gpu",
                                                        "numa-memory-view"]
    cpu = dataclasses.replace(cuda, engines=InstalledEngines(
        sys.executable, [EngineInstall("vllm", "0.32.0", "cpu", sys.executable)]))
    assert [f.id for f in vllm.host_findings(cpu)] == ["no-tcmalloc", "numa-memory-view"]
    assert ENGINES["sglang"].host_findings(cuda) == []
    # the hardware alone finds no engine, the adapters find this Python's
    root = FIX / "hosts" / "epyc-2c-1node"
    bare = hardware_only(root=root, nvml=NoNVML(), engine_python=sys.executable)
    # (not looked for: no "no engine" finding either)
    assert bare.engines.engines == [] and not bare.engines.searched
    assert "no-engine" not in {f.id for f in bare.findings}
    full = probe_host(root=root, nvml=NoNVML(), engine_python=sys.executable)
    assert {e.name for e in full.engines.engines} == {e.name for e in cpu_host.engines.engines}
