"""Run one server from a ``LaunchSpec``: start, wait until ready, stop.

Knows nothing of any engine.  The rules it enforces (ecosystem.md §5):

- each server runs in its own session/process group, started through
  ``qtune.guard``, which kills the group if qtune itself dies (even by
  SIGKILL, when no cleanup code of ours can run);
- output goes to a log file, never to an unread pipe;
- readiness = the health path answers 200 *and* the models path lists the
  served name; a process that exits, or logs a fatal line, ends the wait at
  once; so does a log that shows no progress for half the start timeout
  (at least 5 minutes): a hung start; the wait is bounded by a monotonic
  deadline;
- stop = remember every descendant, SIGTERM the group, wait, SIGKILL the
  group and any survivor (vLLM's engine processes can outlive their parent);
- every live server is registered so signal handlers and ``atexit`` can
  stop it;
- each server gets a private TMPDIR, removed when it stops (by the guard if
  qtune died): engines leave sockets and rendezvous files there, a few per
  start, which a study of many starts would otherwise pile up in /tmp.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from qtune.errors import ServerError
from qtune.guard import TMP_VAR
from qtune.launch import LaunchSpec

_LIVE: set[Server] = set()
_LIVE_LOCK = threading.Lock()


def stop_all() -> None:
    """Stop every server this process started (signal handlers, atexit)."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for s in servers:
        s.stop()


atexit.register(stop_all)


def free_port(host: str = "127.0.0.1", start: int = 20000, end: int = 40000) -> int:
    """A port nothing listens on now, chosen at random.  A race with another
    process remains possible; the caller retries on 'Address already in use'."""
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(start, end)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise ServerError("no free port found", reason="environment")


class Server:
    """One server process group.  Use as a context manager."""

    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_after: float | None = None
        self.tmp: str | None = None

    # -- start ---------------------------------------------------------------
    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = os.environ.copy()
        env.update(self.spec.env)
        env.pop(TMP_VAR, None)  # the guard removes only a dir made here
        for k, v in self.spec.host_env.items():
            env.setdefault(k, v)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        log.write(("$ " + " ".join(self.spec.argv) + "\n").encode())
        log.flush()
        guard = [sys.executable, "-m", "qtune.guard", str(os.getpid()), "--"]
        if "TMPDIR" not in self.spec.env:
            try:
                # Short name: vLLM's ZeroMQ socket paths live under it, and a
                # Unix socket path has 107 bytes.
                self.tmp = tempfile.mkdtemp(prefix="qt-")
            except OSError as exc:
                log.close()
                raise ServerError(
                    f"cannot make a temp dir for the server: {exc}",
                    reason="environment",
                    hint="check that $TMPDIR (or /tmp) is writable and not full",
                ) from None
            env["TMPDIR"] = env[TMP_VAR] = self.tmp
        try:
            self.proc = subprocess.Popen(
                guard + list(self.spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group; no preexec_fn
            )
        except OSError as exc:
            self._remove_tmp()
            raise ServerError(
                f"cannot start {self.spec.argv[0]}: {exc}",
                reason="environment",
                hint="check --engine-python",
            ) from None
        finally:
            log.close()
        self.started_at = time.monotonic()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(
        self,
        timeout: float,
        *,
        on_tick: Callable[[float], None] | None = None,
        classify: Callable[[str], Any] | None = None,
        stall: float | None = None,
    ) -> float:
        """Block until ready; returns seconds since start.  Raises
        ``ServerError`` with a classified reason otherwise.  ``stall``: the
        seconds of a log without progress after which the start is hung
        (default: half the timeout, at least 300 s; a healthy GPU start was
        seen silent for 100 s, while a hung TP start on 2xH200 would have
        held a trial for the whole timeout)."""
        assert self.proc is not None
        deadline = self.started_at + timeout
        stall = max(300.0, timeout / 2) if stall is None else stall
        fatal = [re.compile(p) for p in self.spec.fatal_patterns]
        idle = [re.compile(p) for p in self.spec.idle_patterns]
        seen = 0
        progress_at = self.started_at
        while True:
            now = time.monotonic()
            if on_tick:
                on_tick(now - self.started_at)
            rc = self.proc.poll()
            text = self.log_text()
            if any(ln.strip() and not any(p.search(ln) for p in idle)
                   for ln in re.split(r"[\r\n]", text[seen:])):
                progress_at = now  # tqdm's \r updates count: loading is progress
            # Overlap the last read: a fatal line may arrive in two pieces.
            new, seen = text[max(0, seen - 512):], len(text)
            if rc is not None or any(f.search(new) for f in fatal):
                # A fatal line may precede the root cause's last lines by a
                # moment; give the log a breath before classifying it.
                time.sleep(0.5)
                self._fail(
                    f"server exited with code {rc}" if rc is not None
                    else "server reported a fatal error",
                    classify,
                )
            if now > deadline:
                self._fail(f"not ready after {timeout:.0f} s", classify, timeout=True)
            if now - progress_at > stall:
                self._fail(f"hung: no progress in its log for {stall:.0f} s", classify,
                           timeout=True)
            if self._is_ready():
                self._check_owner()
                self.ready_after = time.monotonic() - self.started_at
                return self.ready_after
            time.sleep(0.5)

    def _fail(
        self, what: str, classify: Callable[[str], Any] | None, timeout: bool = False
    ) -> None:
        text = self.log_text()
        self.stop()
        reason, detail = "timeout" if timeout else "crash", ""
        if classify is not None:
            f = classify(text)
            detail = f.detail
            if not timeout or f.reason != "crash":
                reason = f.reason
        raise ServerError(
            f"{what}: {detail}" if detail else what,
            reason=reason,
            detail=detail,
            log_path=str(self.log_path),
        )

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            # qtune.load.http's bounded GET: no redirect, a whole-request
            # deadline, a body cap, even for the server qtune started.
            from qtune.load.http import request_bytes

            return 200, request_bytes(self.spec.base_url + path, timeout=2)
        except urllib.error.HTTPError as e:
            return e.code, b""
        except (OSError, ValueError):
            return 0, b""

    def _is_ready(self) -> bool:
        status, _ = self._get(self.spec.health_path)
        if status != 200:
            return False
        if self.spec.models_path is None:
            return True
        status, body = self._get(self.spec.models_path)
        if status != 200:
            return False
        try:
            from qtune.untrusted import loads

            ids = [m.get("id") for m in loads(body, self.spec.models_path).get("data", [])]
        except (ValueError, AttributeError):
            return False
        return self.spec.served_model in ids

    def _check_owner(self) -> None:
        """Guard against measuring a stale server from an earlier trial that
        holds the same port: the listener must be one of our processes."""
        assert self.proc is not None
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
            for p in procs:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == self.spec.port:
                        return
        except (psutil.Error, OSError):
            return  # cannot tell (permissions): do not block the trial
        self.stop()
        raise ServerError(
            f"port {self.spec.port} answers, but not from the server qtune started",
            reason="port_in_use",
        )

    # -- stop ----------------------------------------------------------------
    def stop(self, grace: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if proc is None:
            self._remove_tmp()
            return
        # Record the tree first: once the leader dies, orphans are reparented
        # and can no longer be found from it.
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        pgid = proc.pid  # session leader: pgid == pid
        _killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # The leader is gone (or stuck); whatever of the tree still runs
        # gets a short grace, then SIGKILL.
        _, alive = psutil.wait_procs(tree, timeout=2.0)
        _killpg(pgid, signal.SIGKILL)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5.0)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        tmp, self.tmp = self.tmp, None
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def install_signal_handlers() -> None:
    """SIGTERM/SIGHUP behave like Ctrl-C: unwind, stopping servers on the way
    (Optuna marks the running trial failed only on KeyboardInterrupt)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Python leaves SIGINT ignored when it started ignored (a background job
    # of a non-interactive shell, or its children): Ctrl-C must still work.
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):
        pass
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread
            pass
