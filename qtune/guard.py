"""Process-group guard: ``python -m qtune.guard PARENT_PID -- ARGV...``.

Started by ``qtune.server`` as the leader of a new session.  It runs ARGV as
its child (same process group) and watches qtune: if qtune disappears
without stopping the server (SIGKILL, OOM kill, a crashed terminal), the
guard kills the whole group, so no inference server outlives qtune.
Polling the parent pid is used rather than PR_SET_PDEATHSIG because the
latter fires on the exit of the *thread* that forked, and needs preexec_fn.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

# The server's private temp dir (set by qtune.server): removed here when qtune
# died, as qtune would have removed it.
TMP_VAR = "QTUNE_SERVER_TMP"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m qtune.guard PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    # qtune stops the server with killpg(SIGTERM); the guard must outlive the
    # child's shutdown so the group stays findable, so it ignores SIGTERM and
    # exits when the child does (SIGKILL still ends it).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(
            argv[2:], preexec_fn=_default_signals  # noqa: PLW1509 - single-threaded
        )
    except OSError as exc:
        print(f"qtune.guard: cannot start {argv[2]}: {exc}", file=sys.stderr)
        return 127
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            print("qtune.guard: qtune is gone; stopping the server", flush=True)
            pgid = os.getpgrp()
            os.killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if os.environ.get(TMP_VAR):
                shutil.rmtree(os.environ[TMP_VAR], ignore_errors=True)
            os.killpg(pgid, signal.SIGKILL)  # ends the guard too


def _default_signals() -> None:
    # The child must not inherit the guard's ignored SIGTERM/SIGINT.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
