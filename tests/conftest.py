from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qtune.engines import probe_host as probe
from qtune.engines.base import SpaceContext
from qtune.host.installed import EngineInstall
from qtune.model import resolve_model
from tests.fakes.model import make_model
from tests.fakes.nvml import NoNVML

FIX = Path(__file__).parent / "fixtures"
_HEAVY = ("e2e", "pg", "slow", "measures")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier (``-m fast``): every test that starts no real engine, no
    PostgreSQL and no process of seconds; the README's test command runs it
    first, and CI runs it again on the declared dependency floors."""
    for item in items:
        # A test that needs the real PostgreSQL (directly or through another
        # fixture) is in the pg tier whatever its module says.
        if "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pg)
        if not any(item.get_closest_marker(m) for m in _HEAVY):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Generated tokenizers and the embedded model go to a per-session cache,
    # never the user's.
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache"))
    # The inputs and own folders qtune.files remembers are one command's (one
    # process's): tests that run several commands in one process start clean.
    from qtune import files

    monkeypatch.setattr(files, "_INPUTS", set())
    monkeypatch.setattr(files, "_OWN_FOLDERS", set())


@pytest.fixture
def cpu_host():
    return probe(root=FIX / "hosts" / "epyc-2c-1node", nvml=NoNVML(),
                 engine_python=sys.executable)


@pytest.fixture
def cpu_ctx(cpu_host, tmp_path):
    model = resolve_model(str(make_model(tmp_path / "m")))
    install = EngineInstall("vllm", "0.32.0", "cpu", "/opt/venv/bin/python")
    return SpaceContext(cpu_host, model, install)
