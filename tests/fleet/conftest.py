"""A real PostgreSQL server for the fleet tests, one per session.

PostgreSQL refuses to run as root (CI runs as root): the server then runs as
an unprivileged user, created here if missing, in a temporary data folder
with its socket beside it; it listens on a free port of 127.0.0.1 and is
stopped at the end of the session.  Each test gets a database of its own.
"""

from __future__ import annotations

import fcntl
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

PG_USER = "qtunepg"  # the unprivileged OS user the server runs as under root


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """One server: start, stop (a database restart in a test), a fresh
    database's URL."""

    def __init__(self, bindir: Path, root: Path, port: int, user: str | None) -> None:
        self.bindir, self.root, self.port, self.user = bindir, root, port, user
        self.data, self.log = root / "data", root / "server.log"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kw: dict[str, Any] = {"user": self.user, "group": self.user} if self.user else {}
        r = subprocess.run([str(self.bindir / argv[0]), *argv[1:]], check=False,
                           capture_output=True, text=True, timeout=120,
                           cwd=self.root, **kw)
        if check and r.returncode != 0:  # (CalledProcessError would hide why)
            raise RuntimeError(f"{argv[0]} exited {r.returncode} as {self.user or 'this user'}: "
                               f"{r.stdout[-1000:]}{r.stderr[-2000:]}")
        return r

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "qtune",
                  "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c synchronous_commit=off -c max_connections=200")
        r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts,
                      "-w", "-t", "60", "start", check=False)
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {r.stdout}{r.stderr}"
                               f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://qtune@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def _pg_user() -> str | None:
    """The server's unprivileged user under root, created once.  The pg tier
    runs four xdist workers, each with its own server: on a fresh machine two
    of them created the user at once, and both initdb runs then failed with
    "could not look up effective user ID 999: user does not exist" (CI at
    fb9658d).  A lock across the workers makes one create it and the others
    find it."""
    if os.geteuid() != 0:
        return None
    with open(Path(tempfile.gettempdir()) / "qtune-pg-useradd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                                "/usr/sbin/nologin", PG_USER], capture_output=True, text=True)
            if r.returncode not in (0, 9):  # 9: it exists
                raise RuntimeError(f"useradd {PG_USER} exited {r.returncode}: {r.stderr}") from None
            pwd.getpwnam(PG_USER)  # (KeyError if it is still not there)
    return PG_USER


@pytest.fixture(scope="session")
def postgres() -> Any:
    # CI (QTUNE_REQUIRE_VLLM) must run these tests: there a missing server or
    # driver fails them instead of skipping.
    required = os.environ.get("QTUNE_REQUIRE_VLLM") == "1"
    bindir = _bindir()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        if required:
            raise
        pytest.skip("psycopg is not installed (pip install 'qtune[fleet]')")
    if bindir is None:
        if required:
            pytest.fail("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)")
        pytest.skip("no PostgreSQL server binaries")
    user = _pg_user()
    # Not under pytest's base temp: its folders are 0700 root, which the
    # server's user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="qtune-pg-"))
    if user:
        info = pwd.getpwnam(user)
        os.chown(root, info.pw_uid, info.pw_gid)
    pg = Postgres(bindir, root, _free_port(), user)
    pg.init()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
