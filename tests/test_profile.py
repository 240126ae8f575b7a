from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qtune.errors import ProfileError
from qtune.profile import Profile
from tests.fakes.profile import sample_profile


def test_round_trip(tmp_path):
    p = sample_profile()
    path = tmp_path / "p.yaml"
    p.save(path)
    assert Profile.load(path) == p
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temp left


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("- a\n", "must be a mapping"),
        ("name: x\n", "created"),  # missing fields name the field
    ],
)
def test_load_rejects(tmp_path, text, needle):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=needle):
        Profile.load(path)


def test_missing_file():
    with pytest.raises(ProfileError) as e:
        Profile.load(Path("/nonexistent/p.yaml"))
    assert e.value.hint


def test_unknown_field_rejected(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(sample_profile().dump() + "surprise: 1\n")
    with pytest.raises(ProfileError, match="surprise"):
        Profile.load(path)


@pytest.mark.parametrize(
    "over",
    [
        {"env": {"HF_TOKEN": "abc"}},
        {"env": {"X": "hf_abcdefghijklmnopqrstuvwxyz"}},
        {"argv": [sys.executable, "--api-key", "hf_abcdefghijklmnopqrstuvwxyz"]},
        {"argv": ["python", "-m", "x"]},  # relative executable
    ],
)
def test_secrets_and_bad_argv_rejected(over):
    with pytest.raises(Exception) as e:
        sample_profile(**over)
    assert "hf_abcdefghij" not in str(e.value)


def test_write_atomic_gives_the_mode_open_would(tmp_path):
    import os

    from qtune.profile import write_atomic

    umask = os.umask(0o022)
    try:
        p = tmp_path / "p.yaml"
        write_atomic(p, "a: 1\n")
        assert p.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
        p.chmod(0o640)
        write_atomic(p, "a: 2\n")  # a replaced file keeps its mode
        assert p.stat().st_mode & 0o777 == 0o640 and p.read_text() == "a: 2\n"
    finally:
        os.umask(umask)
