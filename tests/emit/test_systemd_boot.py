"""The emitted unit under a real systemd: PID 1 of a container
(systemd-nspawn -b over a minimal Debian that debootstrap builds), since this
host's PID 1 is not systemd.  A study's profile, as a user makes it, emitted
as the quick start does (``--user`` root, ``--allow-tmp`` for a checkout
under /tmp), is started by that systemd with its sandbox (NoNewPrivileges=,
PrivateTmp=, Protect*=, CacheDirectory=) and must answer a completion.  Then
the unit qtune refuses to write (a DynamicUser= whose python links under
/root) is written anyway, bypassing the check, and must fail as the refusal
says (203/EXEC): the check and systemd agree.

~2.5 min here: debootstrap 46 s, the study ~40 s, the server ~35 s."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from qtune.emit import systemd
from qtune.profile import Profile
from tests.test_e2e_vllm import HAVE_VLLM, qtune

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed"),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("systemd-nspawn")
                       or not shutil.which("debootstrap"),
                       reason="needs root, systemd-nspawn and debootstrap (scripts/test.sh "
                              "installs them)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Container:
    """A booted container: ``run`` is a command inside it (nsenter into its
    PID 1), ``stop`` powers it off."""

    def __init__(self, root: Path, binds: list[str], log: Path) -> None:
        self.log = log
        args = ["systemd-nspawn", "-D", str(root), "-b", "--register=no", "--keep-unit",
                "--console=read-only", "-M", f"qtune-test-{os.getpid()}",
                *[f"--bind-ro={b}" for b in binds]]
        self.proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_up()
        except BaseException:
            self._kill()
            raise

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 60
        self.pid1 = None
        while time.monotonic() < deadline and self.pid1 is None:
            # the container's PID 1: nspawn's child that is PID 1 in its own
            # namespace (not a short-lived helper)
            for kid in subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                                      text=True).stdout.split():
                status = Path(f"/proc/{kid}/status").read_text() if Path(
                    f"/proc/{kid}").exists() else ""
                nspid = [ln.split()[-1] for ln in status.splitlines() if ln.startswith("NSpid:")]
                if nspid == ["1"]:
                    self.pid1 = int(kid)
            time.sleep(0.5)
        assert self.pid1, self.log.read_text()[-2000:]
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(1)
        raise AssertionError(f"the container's systemd did not come up: {state}\n"
                             + self.log.read_text()[-2000:])

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["nsenter", "-t", str(self.pid1), "-a", *cmd],
                           capture_output=True, text=True, timeout=120)
        if check:
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        return r

    def stop(self) -> None:
        self.run("systemctl", "poweroff", check=False)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self._kill()


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    """A minimal Debian with systemd and the shared libraries the host has
    that the server links to (libnuma for vLLM's CPU build; python3 brings
    the interpreter's: sqlite3, ssl, ffi, ...): the unit's own files come
    from the host, bound read-only at the same paths."""
    root = tmp_path_factory.mktemp("nspawn") / "root"
    r = subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=systemd,systemd-sysv,dbus,libnuma1,python3", "bookworm",
                        str(root), "http://deb.debian.org/debian"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root


def test_the_emitted_unit_starts_and_serves_under_systemd(rootfs, tmp_path, monkeypatch):
    # The study's files where a service can see them: not /tmp (PrivateTmp=)
    # and not /root (closed), as the emitter's check asks.
    home = Path(f"/srv/qtune-boot-test-{os.getpid()}")
    home.mkdir(mode=0o755)
    try:
        monkeypatch.setenv("QTUNE_CACHE", str(home / "cache"))  # the model the unit serves
        r = qtune("search", "--trials", "1", "--confirm-top", "0", "--concurrency", "2",
                  "--requests", "4", "--warmup", "1", "--input-len", "16", "--output-len", "8",
                  "--study", "boot", "--out", str(home / "boot.yaml"), "--json", cwd=tmp_path,
                  timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        profile = Profile.load(home / "boot.yaml")
        port = _free_port()
        # as the quick start emits it: as the invoking user, /tmp kept visible
        # for a checkout that lies there
        in_tmp = sys.prefix.startswith(("/tmp/", "/var/tmp/"))
        units = rootfs / "etc" / "systemd" / "system"
        emit = ["emit", str(home / "boot.yaml"), "--user", "root",
                *(["--allow-tmp"] if in_tmp else []), "-o", str(units / "qtune-boot.service")]
        r = qtune(*emit, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        unit = (units / "qtune-boot.service").read_text()
        assert "--port 8000" in unit
        (units / "qtune-boot.service").write_text(unit.replace("--port 8000", f"--port {port}"))

        # the unit qtune refuses: its default DynamicUser= cannot run this
        # venv's python where it links under /root; written anyway
        dyn = systemd.check_paths
        r = qtune("emit", str(home / "boot.yaml"), *(["--allow-tmp"] if in_tmp else []),
                  cwd=tmp_path)
        refused = r.returncode != 0 and "out of reach" in r.stderr
        if os.path.realpath(sys.executable).startswith("/root/"):
            assert refused, r.stderr  # this VM's venvs link under /root (0700)
        if refused:
            systemd.check_paths = lambda *a, **k: None  # type: ignore[assignment]
            try:
                text = systemd.render(profile, allow_tmp=in_tmp)
            finally:
                systemd.check_paths = dyn
            (units / "qtune-dyn.service").write_text(
                text.replace("--port 8000", f"--port {_free_port()}"))

        binds = list(dict.fromkeys([sys.prefix, os.path.realpath(sys.base_prefix), str(home)]))
        box = Container(rootfs, binds, tmp_path / "boot.log")
        try:
            box.run("systemctl", "daemon-reload")
            box.run("systemctl", "start", "qtune-boot.service")
            deadline, body = time.monotonic() + 240, None
            while time.monotonic() < deadline and body is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models",
                                                timeout=2) as resp:
                        body = json.load(resp)
                except OSError:
                    # Restart=on-failure: a failed start shows as a restart
                    st = box.run("systemctl", "show", "qtune-boot.service", "-p",
                                 "NRestarts,ActiveState").stdout
                    assert "NRestarts=0" in st and "ActiveState=failed" not in st, \
                        box.run("journalctl", "-u", "qtune-boot", "--no-pager").stdout[-4000:]
                    time.sleep(2)
            assert body is not None, box.run("journalctl", "-u", "qtune-boot",
                                              "--no-pager").stdout[-4000:]
            served = profile.model["served_name"]
            assert [m["id"] for m in body["data"]] == [served]
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", method="POST",
                headers={"Content-Type": "application/json"},
                data=json.dumps({"model": served, "prompt": "hello", "max_tokens": 4}).encode())
            with urllib.request.urlopen(req, timeout=60) as resp:
                out = json.load(resp)
            assert out["usage"]["completion_tokens"] == 4
            # the sandbox systemd applied, as systemd reports it
            show = box.run("systemctl", "show", "qtune-boot.service", "-p",
                           "ActiveState,NoNewPrivileges,PrivateTmp,ProtectKernelModules,User"
                           ).stdout
            assert "ActiveState=active" in show and "NoNewPrivileges=yes" in show
            assert "ProtectKernelModules=yes" in show and "User=root" in show
            assert ("PrivateTmp=yes" in show) != in_tmp
            box.run("systemctl", "stop", "qtune-boot.service")
            if refused:
                box.run("systemctl", "start", "qtune-dyn.service", check=False)
                time.sleep(2)
                st = box.run("systemctl", "show", "qtune-dyn.service", "-p",
                             "ExecMainStatus,Result").stdout
                assert "ExecMainStatus=203" in st, st  # 203/EXEC: as refused
        finally:
            box.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
