"""The libraries qtune relies on are checked at startup (qtune.deps): a
version outside the declared range stops qtune before anything runs
(issue 27: Optuna 4.5 failed on Trial.set_constraint after an 8-minute GPU
trial)."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from qtune import deps
from qtune.errors import SetupError

ROOT = Path(__file__).parent.parent


def test_every_declared_requirement_is_met_here():
    reqs = deps.declared()
    assert {"optuna", "typer", "pandas"} <= {r.name for r in reqs}
    assert deps.problems() == []


def test_the_declared_optuna_floor_has_the_api_qtune_uses():
    import optuna

    floor = next(r for r in deps.declared() if r.name == "optuna")
    assert floor.specifier.contains("5.0.0") and not floor.specifier.contains("4.5.0")
    assert hasattr(optuna.trial.Trial, "set_constraint")


def test_a_version_outside_the_range_is_named():
    have = md.version("optuna")
    found = deps.problems([Requirement("optuna>=99"), Requirement("no-such-dist-qtune>=1")])
    assert found[0] == f"optuna {have} is installed; qtune needs optuna>=99"
    assert found[1].startswith("no-such-dist-qtune is not installed")


def test_check_refuses_with_a_hint(monkeypatch):
    monkeypatch.setattr(deps, "declared", lambda: [Requirement("optuna>=99,<100")])
    with pytest.raises(SetupError) as e:
        deps.check()
    assert "optuna" in str(e.value) and "pip install 'optuna<100,>=99'" in e.value.hint
    assert "set_constraint" in e.value.hint


def test_the_cli_stops_before_anything_runs(tmp_path):
    """A library outside its range: one error line, exit 1, nothing written
    (here a fake optuna metadata earlier on the path)."""
    fake = tmp_path / "site"
    dist = fake / "optuna-4.5.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optuna\nVersion: 4.5.0\n")
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "qtune", "search", "--out",
                        str(tmp_path / "p.yaml")], capture_output=True, text=True,
                       env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: optuna 4.5.0 is installed; qtune needs optuna")
    assert "Traceback" not in r.stderr and not (tmp_path / "p.yaml").exists()
