"""The probe finds the TGI launcher and says what else TGI needs to start."""

from __future__ import annotations

import dataclasses
import sys

from qtune.host import findings
from qtune.host.installed import find_engines


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
