"""``qtune search --engine NAME``: the engine is a choice, and one that is
not installed is refused in one error line with what to install, before
anything is created or launched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("name,needle", [("sglang", "pip install 'sglang=="),
                                         ("tgi", "text-generation-server")])
def test_an_engine_that_is_not_installed_is_refused_with_a_hint(name, needle, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), QTUNE_CACHE=str(tmp_path / "cache"),
               COLUMNS="500", PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    r = subprocess.run([sys.executable, "-m", "qtune", "search", "--engine", name,
                        "--trials", "1"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=120)
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert lines[0] == f"error: {name} is not installed for {sys.executable}", lines
    assert lines[1].startswith("hint: ") and needle in lines[1], lines
    assert len(lines) == 2
    # no study, log or profile: only the model cache the input check may fill
    assert [p.name for p in tmp_path.iterdir() if p.name != "cache"] == []


def test_an_unknown_engine_names_the_registered_ones(tmp_path):
    r = subprocess.run([sys.executable, "-m", "qtune", "search", "--engine", "trtllm"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="500",
                                QTUNE_CACHE=str(tmp_path / "cache")))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "unknown engine 'trtllm'" in out
    assert "sglang, tgi, transformers, vllm" in out


def _search(args: list[str], tmp_path: Path) -> tuple[int, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), QTUNE_CACHE=str(tmp_path / "cache"),
               COLUMNS="500", PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    r = subprocess.run([sys.executable, "-m", "qtune", "search", *args, "--trials", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    return r.returncode, [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]


@pytest.mark.engine
@pytest.mark.parametrize("engines,first,hint", [
    ("vllm,vllm", "error: --engine vllm,vllm: vllm is named twice",
     "hint: name each engine once, e.g. --engine vllm,sglang"),
    ("vllm,nosuch", "error: unknown engine 'nosuch'",
     "hint: available: sglang, tgi, transformers, vllm"),
    # only vLLM is installed here: the other engine is refused before vLLM is
    # asked anything, and before any file
    ("vllm,sglang", f"error: sglang is not installed for {sys.executable}",
     "hint: pip install 'sglang=="),
])
def test_a_bad_engine_list_is_one_error_and_nothing_is_created(engines, first, hint,
                                                                tmp_path):
    rc, lines = _search(["--engine", engines], tmp_path)
    assert rc != 0 and lines[0] == first and lines[1].startswith(hint), lines
    assert len(lines) == 2, lines
    assert [p.name for p in tmp_path.iterdir() if p.name != "cache"] == []
