"""Two `qtune search` workers on the CPU build of vLLM share one study in a
real PostgreSQL; one is SIGKILLed while its server starts.  Kept short (the
tiny model, 8 requests, 3 launches): two vLLM servers at once on 2 cores
is heavy."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from qtune.search.fleet import FleetAttr
from qtune.search.records import LAUNCHED, Attr

ROOT = Path(__file__).parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed")]

LOAD = ["--concurrency", "2", "--requests", "8", "--warmup", "2",
        "--input-len", "32", "--output-len", "8"]


def worker(url: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "qtune", "search", "--study", "fleet", "--storage", url,
         "--trials", "3", "--confirm-top", "0", "--heartbeat", "2", "--json", *LOAD],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def servers_of(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:  # a child may exit (or be a zombie) between the listing and this read
            if "vllm.entrypoints" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.Error:
            pass
    return out


def test_two_workers_one_killed_mid_trial(postgres, tmp_path):
    url = postgres.new_database()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = worker(url, tmp_path / "a")
    time.sleep(5)  # a creates the study and runs the engine defaults
    b = worker(url, tmp_path / "b")
    deadline = time.monotonic() + 400
    while not (victims := servers_of(b.pid)) and time.monotonic() < deadline:
        assert b.poll() is None, b.communicate()
        time.sleep(0.5)
    assert victims, "worker b never started a server"
    tree = victims + [c for v in victims for c in v.children(recursive=True)]
    time.sleep(3)  # mid-start
    b.send_signal(signal.SIGKILL)
    b.wait(timeout=30)
    _, alive = psutil.wait_procs(tree, timeout=40)
    assert not alive, [p.cmdline() for p in alive]
    out, err = a.communicate(timeout=800)
    assert a.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["profile"] and Path(res["profile"]).is_file()
    study = optuna.load_study(study_name="fleet", storage=url)
    me_b = f"{socket.gethostname()}:{b.pid}"
    dead = [t for t in study.get_trials() if t.user_attrs.get(FleetAttr.WORKER) == me_b
            and t.state == TrialState.FAIL]
    assert len(dead) == 1
    launched = [t for t in study.get_trials() if t.user_attrs.get(Attr.STATUS) in LAUNCHED]
    assert len(launched) == 3
    assert [t.user_attrs.get(FleetAttr.RETRY_OF) for t in launched].count(dead[0].number) == 1
    assert sum(1 for t in launched if t.user_attrs.get(Attr.BASELINE)) == 1
