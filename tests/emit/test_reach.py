"""Can the unit's user reach a path?  `qtune emit --format systemd` answers
from the permission bits (qtune.emit.systemd._blocker); here the answer is
checked against the kernel's own: a process of that user (setpriv) trying
the same path, on generated folder trees with generated owners, groups,
modes and links (one hop, two hops through a folder of its own mode, "..").
The case that showed the class: a venv's bin/python in a readable folder,
linking to an interpreter under /root (0700).  The generated programs are
scripts (read and run); an ELF binary needs only the execute bit, checked
below on the system's python."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qtune.emit.systemd import _blocker

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user")

NOBODY = 65534
MODES = st.sampled_from([0o700, 0o711, 0o750, 0o755, 0o701, 0o705, 0o770, 0o751, 0o500])
FILE_MODES = st.sampled_from([0o600, 0o640, 0o644, 0o604, 0o755, 0o700, 0o711, 0o000])
IDS = st.sampled_from([0, NOBODY])


def kernel_says(path: str, *, run: bool) -> bool:
    """Whether uid/gid 65534 with no other group gets to ``path``: a folder
    listed and each file in it readable; a file readable (runnable if
    ``run``)."""
    last = '[ -r "$p" ] && [ -x "$p" ]' if run else '[ -r "$p" ]'
    script = ('p="$1"; if [ -d "$p" ]; then ls "$p" >/dev/null 2>&1 || exit 1; '
              'for f in "$p"/*; do [ -f "$f" ] && { [ -r "$f" ] || exit 1; }; done; exit 0; fi; '
              + last)
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                        "sh", "-c", script, "sh", path], capture_output=True)
    return r.returncode == 0


@st.composite
def trees(draw):
    """A chain of 1-3 folders ending in a file or a folder of files, each
    with a drawn owner, group and mode; maybe a link to the end from a
    folder anyone can pass."""
    depth = draw(st.integers(1, 3))
    folders = [(draw(MODES), draw(IDS), draw(IDS)) for _ in range(depth)]
    end_is_dir = draw(st.booleans())
    files = [(draw(FILE_MODES), draw(IDS), draw(IDS))
             for _ in range(draw(st.integers(0 if end_is_dir else 1, 2)))]
    end_mode = draw(MODES) if end_is_dir else None
    # how the path reaches the end: as written, through a link, through a
    # link to a link that lies in a folder of its own mode, or through ".."
    via = draw(st.sampled_from(["direct", "link", "two-hop", "dotdot"]))
    return (folders, end_is_dir, end_mode, files, via, draw(MODES), draw(st.booleans()))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees())
def test_the_emitters_verdict_is_the_kernels(tree):
    folders, end_is_dir, end_mode, files, via, hop_mode, run = tree
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="qtune-reach-"))
    try:
        base.chmod(0o755)
        here = base
        for i, _ in enumerate(folders):
            here = here / f"d{i}"
            here.mkdir()
        if end_is_dir:
            target = here / "model"
            target.mkdir()
            for j, (mode, uid, gid) in enumerate(files):
                f = target / f"w{j}"
                f.write_text("x")
                os.chown(f, uid, gid)
                f.chmod(mode)
            os.chown(target, 0, 0)
            target.chmod(end_mode)
        else:
            mode, uid, gid = files[0]
            target = here / "python"
            target.write_text("#!/bin/sh\n")
            os.chown(target, uid, gid)
            target.chmod(mode)
        # modes last, innermost first: a closed folder is still ours to fill
        here = base
        chain = []
        for i in range(len(folders)):
            here = here / f"d{i}"
            chain.append(here)
        for d, (mode, uid, gid) in zip(chain, folders, strict=True):
            os.chown(d, uid, gid)
            d.chmod(mode)
        path = str(target)
        if via == "link":
            path = str(base / "link")
            os.symlink(target, path)
        elif via == "two-hop":
            hop = base / "hop"
            hop.mkdir()
            (hop / "link2").symlink_to(target)
            hop.chmod(hop_mode)
            path = str(base / "link")
            os.symlink("hop/link2", path)  # relative, then absolute
        elif via == "dotdot":
            path = str(chain[0] / ".." / target.relative_to(base))
        ours = _blocker(path, (NOBODY, {NOBODY}), run=run) is None
        assert ours == kernel_says(path, run=run and not end_is_dir), (
            tree, _blocker(path, (NOBODY, {NOBODY}), run=run))
    finally:
        for d in [base, *base.rglob("*")]:
            if d.is_dir() and not d.is_symlink():
                d.chmod(0o755)
        shutil.rmtree(base)


def test_a_venv_python_linking_under_a_closed_folder_is_out_of_reach():
    """The case the real systemd showed (203/EXEC): the link lies in an open
    folder, the interpreter under a closed one."""
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="qtune-reach-"))
    try:
        base.chmod(0o755)
        closed = base / "root"
        (closed / "bin").mkdir(parents=True)
        py = closed / "bin" / "python3"
        py.write_text("#!/bin/sh\n")
        py.chmod(0o755)
        closed.chmod(0o700)
        venv = base / "venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").symlink_to(py)
        why = _blocker(str(venv / "python"), (-1, set()), run=True)
        assert why is not None and str(closed) in why and "0700" in why
        assert not kernel_says(str(venv / "python"), run=True)
        closed.chmod(0o755)
        assert _blocker(str(venv / "python"), (-1, set()), run=True) is None
    finally:
        shutil.rmtree(base)


def test_a_binary_runs_with_the_execute_bit_alone():
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="qtune-reach-"))
    try:
        base.chmod(0o755)
        exe = base / "python3"
        shutil.copy(os.path.realpath("/usr/bin/python3"), exe)
        exe.chmod(0o711)
        assert _blocker(str(exe), (-1, set()), run=True) is None
        # through a shell of that user: setpriv's own exec still ran a
        # program behind a closed folder here (its credentials at exec)
        def runs() -> bool:
            r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                "--clear-groups", "sh", "-c", '"$0" -c "print(1)"', str(exe)],
                               capture_output=True, text=True)
            return r.stdout.strip() == "1"
        assert runs()
        exe.chmod(0o744)  # readable, not runnable by others
        assert "0744" in (_blocker(str(exe), (-1, set()), run=True) or "")
        assert not runs()
    finally:
        shutil.rmtree(base)
