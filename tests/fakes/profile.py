"""A valid profile to build on: ``sample_profile(params=..., env=...)``."""

from __future__ import annotations

import os
import sys

from qtune.profile import Profile


def _visible_python() -> str:
    """A Python for argv[0] that a sandboxed unit can run: this one, unless
    it lies under /tmp (hidden by PrivateTmp=) or a DynamicUser= could not
    reach it (a venv's python links to an interpreter under /root, mode 0700,
    on this VM), where `qtune emit --format systemd` refuses it; then the
    interpreter it links to, or the system's.  systemd-analyze verify checks
    that the file exists."""
    from qtune.emit.systemd import _blocker

    for exe in (sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"):
        real = os.path.realpath(exe)
        if (os.path.isfile(exe) and not real.startswith(("/tmp/", "/var/tmp/"))
                and not exe.startswith(("/tmp/", "/var/tmp/"))
                and _blocker(exe, (-1, set()), run=True) is None):
            return exe
    return sys.executable


PYTHON = _visible_python()


def sample_profile(**over) -> Profile:
    data = dict(
        name="tiny-test",
        created="2026-11-29T00:00:00+00:00",
        qtune_version="0.1.0",
        engine={"name": "vllm", "version": "0.32.0", "build": "cpu"},
        model={"id": "tiny", "path": "/m"},
        params={"max_num_seqs": 8},
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"},
        argv=[PYTHON, "-m", "vllm.entrypoints.openai.api_server",
              "--model", "/m", "--port", "8000", "--max-num-seqs", "8"],
        metrics={"objective": {"name": "e2e_p99", "direction": "minimize",
                               "best": 100.0, "baseline": 150.0}, "startup_s": 40.0},
        workload={"input_len": 16},
        slo=[],
        host={"id": "abc"},
        study={"storage": "journal:///x", "name": "s", "trial": 1, "trials_run": 3},
    )
    data.update(over)
    return Profile.model_validate(data)
