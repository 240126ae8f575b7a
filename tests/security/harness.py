"""Running qtune as its console script does (``cli.main``, in this process
for speed), and the checks every hostile case must pass: an expected exit
code, no traceback or internal error, no raw escape byte, no secret in any
output or written file, no write outside the allowed targets, within a time
limit."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from qtune import cli, console

SECRET = "hunter2SECRETpw"
SECRETS = (SECRET, "hf_abcdefghijkl", "sk-" + "q" * 24, "ghp_" + "z" * 36)
TIME_LIMIT_S = 20.0


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str, float]:
    """``qtune ARGS`` through cli.main: (exit code, stdout, stderr, seconds)."""
    monkeypatch.setattr(sys, "argv", ["qtune", *args])
    monkeypatch.setattr("qtune.server.install_signal_handlers", lambda: None)
    monkeypatch.setattr(console.err, "_width", 1000)
    monkeypatch.setattr(console.out, "_width", 1000)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cli.main()
    took = time.monotonic() - t0
    out, err = capsys.readouterr()
    code = e.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out, err, took


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (links not followed) with a digest of what
    it is: a file's bytes, a link's target, a folder."""
    snap = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                snap[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                snap[rel] = "dir"
            else:
                try:
                    snap[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError:
                    snap[rel] = "unreadable"
    return snap


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def check_outcome(rc: int, out: str, err: str, took: float, rcs: Iterable[int],
                  written: Iterable[Path] = (), secrets: Iterable[str] = SECRETS) -> None:
    both = out + err
    assert rc in set(rcs), f"exit {rc}, wanted {sorted(set(rcs))}: {err[-600:]}"
    assert "Traceback" not in both, both[-2000:]
    assert "internal error" not in err, err[-600:]
    assert "\x1b" not in both, "a raw escape reached the terminal"
    for s in secrets:
        assert s not in both, f"secret {s[:6]}... printed"
        for p in written:
            if p.is_file() and not p.is_symlink():
                assert s not in p.read_text(errors="replace"), f"secret in {p}"
    assert took < TIME_LIMIT_S, f"took {took:.1f} s"
    if rc == 1:  # a refusal: one error line and its hint
        lines = [ln for ln in err.splitlines() if ln.startswith(("error:", "hint:"))]
        assert lines and lines[0].startswith("error:"), err[-600:]
