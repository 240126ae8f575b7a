from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from qtune.engines.base import LaunchSpec
from qtune.errors import ServerError
from qtune.server import Server, free_port

# Not in the fast tier: real process groups started and killed (2-5 s each).
pytestmark = pytest.mark.slow


ROOT = Path(__file__).parent.parent


def spec(port: int, *opts: str, name: str = "m", served: str = "m") -> LaunchSpec:
    return LaunchSpec(
        argv=(sys.executable, "-m", "tests.fakes.server", str(port), name, *opts),
        env={"PYTHONPATH": str(ROOT)},
        host="127.0.0.1", port=port, served_model=served,
        fatal_patterns=("FATAL-ENGINE-ERROR",),
        idle_patterns=("IDLE-WAIT",),
    )


def group_alive(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def test_ready_then_stop_kills_the_whole_group(tmp_path):
    port = free_port()
    s = Server(spec(port, "--ready-after", "0.5", "--stubborn-child"), tmp_path / "s.log")
    with s:
        took = s.wait_ready(30)
        assert 0.4 < took < 30
        pgid = s.proc.pid
        assert len(group_alive(pgid)) >= 3  # guard, server, stubborn grandchild
    assert group_alive(pgid) == []
    assert "$ " in (tmp_path / "s.log").read_text()  # command line logged


def _server_tmp(log: Path) -> Path:
    line = next(ln for ln in log.read_text().splitlines() if ln.startswith("tmp "))
    return Path(line.split()[1])


def test_each_server_gets_a_private_tmpdir_removed_when_it_stops(tmp_path):
    sp = dataclasses.replace(spec(free_port()),
                             host_env={"QTUNE_TEST_PROBE": "host", "PYTHONPATH": "x"})
    with Server(sp, tmp_path / "s.log") as s:
        s.wait_ready(30)
        left = _server_tmp(tmp_path / "s.log")
        assert left.exists() and left.parent == Path(s.tmp)
        assert Path(s.tmp).parent == Path(tempfile.gettempdir())
    assert not left.parent.exists()
    log = (tmp_path / "s.log").read_text()
    assert "probe=host" in log  # a host default applies when nothing sets it
    # ... but never over the spec's own env (PYTHONPATH="x" would break the
    # import of tests.fakes.server) or the caller's environment.
    os.environ["QTUNE_TEST_PROBE"] = "caller"
    try:
        with Server(sp, tmp_path / "t.log") as s:
            s.wait_ready(30)
    finally:
        del os.environ["QTUNE_TEST_PROBE"]
    assert "probe=caller" in (tmp_path / "t.log").read_text()


def test_the_guard_only_ever_removes_a_dir_qtune_made(tmp_path, monkeypatch):
    """A QTUNE_SERVER_TMP inherited from the caller, or a TMPDIR the spec
    sets, must never become a path the guard deletes."""
    from qtune.guard import TMP_VAR

    mine = tmp_path / "users-own"
    mine.mkdir()
    monkeypatch.setenv(TMP_VAR, str(mine))
    sp = dataclasses.replace(spec(free_port()), env={**spec(0).env, "TMPDIR": str(mine)})
    with Server(sp, tmp_path / "s.log") as s:
        s.wait_ready(30)
        assert s.tmp is None
        assert TMP_VAR not in psutil.Process(s.proc.pid).environ()
    assert mine.exists()


def test_no_temp_dir_is_an_environment_error_before_any_process(tmp_path, monkeypatch):
    def full(**kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    s = Server(spec(free_port()), tmp_path / "s.log")
    with pytest.raises(ServerError) as e:
        s.start()
    assert e.value.reason == "environment" and "temp dir" in e.value.message
    assert s.proc is None


def test_early_exit_ends_the_wait_at_once(tmp_path):
    s = Server(spec(free_port(), "--exit-after", "0.2"), tmp_path / "s.log")
    t0 = time.monotonic()
    with s, pytest.raises(ServerError) as e:
        s.wait_ready(60)
    assert time.monotonic() - t0 < 10
    assert "code 3" in e.value.message
    assert e.value.reason == "crash"


def test_fatal_log_line_ends_the_wait_although_the_process_lives(tmp_path):
    s = Server(spec(free_port(), "--fatal-after", "0.2"), tmp_path / "s.log")
    t0 = time.monotonic()
    with s, pytest.raises(ServerError):
        s.wait_ready(60)
    assert time.monotonic() - t0 < 10
    assert s.proc is None  # stopped


def test_a_log_that_only_waits_is_a_hung_start_but_a_busy_one_is_not(tmp_path):
    s = Server(spec(free_port(), "--idle"), tmp_path / "idle.log")
    t0 = time.monotonic()
    with s, pytest.raises(ServerError) as e:
        s.wait_ready(60, stall=1.5)
    assert time.monotonic() - t0 < 10
    assert "hung: no progress in its log for 2 s" in e.value.message
    assert e.value.reason == "timeout" and s.proc is None
    # Progress lines keep the start alive until the deadline.
    s = Server(spec(free_port(), "--busy"), tmp_path / "busy.log")
    with s, pytest.raises(ServerError) as e:
        s.wait_ready(3, stall=1.5)
    assert "not ready after 3 s" in e.value.message


def test_timeout_and_wrong_model(tmp_path):
    s = Server(spec(free_port(), served="other"), tmp_path / "s.log")
    with s, pytest.raises(ServerError) as e:
        s.wait_ready(2)
    assert e.value.reason == "timeout"


def test_missing_executable(tmp_path):
    bad = LaunchSpec(argv=("/nonexistent/python",), env={}, host="127.0.0.1",
                     port=free_port(), served_model="m")
    s = Server(bad, tmp_path / "s.log")
    with s, pytest.raises(ServerError):
        s.wait_ready(10)


def test_guard_kills_the_server_when_qtune_is_killed(tmp_path):
    port = free_port()
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from tests.test_server import spec
        from qtune.server import Server
        s = Server(spec({port}, "--stubborn-child"), Path({str(tmp_path / 's.log')!r}))
        s.start(); s.wait_ready(30)
        print(s.proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    pgid = int(parent.stdout.readline())
    assert group_alive(pgid)
    left = _server_tmp(tmp_path / "s.log")
    assert left.exists()
    parent.kill()  # SIGKILL: no cleanup code of qtune's can run
    parent.wait()
    deadline = time.monotonic() + 30
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert group_alive(pgid) == []
    assert not left.parent.exists()  # the guard removed the server's temp dir


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
