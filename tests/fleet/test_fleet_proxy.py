"""Workers through one ``qtune storage-proxy`` (Optuna's gRPC proxy) in
front of the real PostgreSQL: the proxy alone holds the database URL and
its password, and nothing shows the password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from qtune.search.fleet import BEAT, FleetAttr
from qtune.search.records import Attr, StudyAttr
from tests.fleet.conftest import _free_port
from tests.fleet.test_fleet_postgres import (
    ROOT,
    assert_secret_nowhere,
    config,
    finish,
    launched,
    load,
    running_trial_of,
    spawn,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)


def start_proxy(url: str, port: int) -> subprocess.Popen[str]:
    # From the environment: the password stays out of the process list.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QTUNE_STORAGE": url}
    return subprocess.Popen([sys.executable, "-m", "qtune", "storage-proxy", "--port",
                             str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_workers_share_a_study_through_one_proxy(postgres, tmp_path):
    url = postgres.new_database()
    secret = "Zq9-pr0xy"
    port = _free_port()
    proxy = start_proxy(url.replace("qtune@", f"qtune:{secret}@"), port)
    try:
        # confirm_top 2: with 1, a study whose best is the baseline has nothing
        # to confirm (confirm_top re-measures the top K and the defaults).
        cfg = config(tmp_path, f"grpc://127.0.0.1:{port}", "proxied", trials=6,
                     confirm_top=2)
        results = [finish(p) for p in [spawn(cfg) for _ in range(2)]]
    finally:
        proxy.send_signal(signal.SIGINT)
        out, err = proxy.communicate(timeout=30)
    for rc, _, werr in results:
        assert rc == 0, werr
    assert proxy.returncode == 0, err
    assert "storage proxy for postgresql://qtune:***@127.0.0.1:" in err, err
    study = load(url, "proxied")
    runs = launched(study)
    assert len(runs) == 6  # the study's budget, not each worker's
    assert sum(1 for t in runs if t.user_attrs.get(Attr.BASELINE)) == 1
    assert len({t.user_attrs[FleetAttr.WORKER] for t in runs}) == 2
    # Beaten through the proxy: qtune's beat, each trial its own.
    assert all(t.system_attrs[BEAT][0] == t._trial_id for t in runs)
    assert study.user_attrs.get(StudyAttr.CONFIRMATION)
    profiles = [r[1]["profile"] for r in results if r[1]["profile"]]
    assert len(profiles) == 1
    assert_secret_nowhere(secret, out + err + "".join(r[2] for r in results), tmp_path)


def test_the_proxy_refuses_a_storage_that_is_not_a_database_server(tmp_path):
    r = subprocess.run([sys.executable, "-m", "qtune", "storage-proxy", "--storage",
                        f"journal://{tmp_path}/x.log"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    text = " ".join(r.stderr.split())  # (the console wraps long lines)
    assert r.returncode == 1
    assert text.startswith("error: --storage journal://"), r.stderr
    assert "not a database server's URL hint:" in text


def test_a_worker_that_loses_the_proxy_stops_its_server_with_one_error(postgres,
                                                                      tmp_path):
    url = postgres.new_database()
    port = _free_port()
    proxy = start_proxy(url, port)
    try:
        worker = spawn(config(tmp_path, f"grpc://127.0.0.1:{port}", "cut", trials=3))
        _, servers = wait_for(lambda: running_trial_of(url, "cut", worker.pid,
                                                       baseline_ok=True), 120,
                              "a trial with its server up")
    finally:
        proxy.kill()
        proxy.communicate(timeout=30)
    out, err = worker.communicate(timeout=60)
    _, alive = psutil.wait_procs(servers, timeout=20)
    assert worker.returncode == 1, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: lost the study's database grpc://127.0.0.1:{port}:"), err
    assert not alive  # the worker stopped its server before it exited
