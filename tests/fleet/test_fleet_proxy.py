"""Workers through one ``qtune storage-proxy`` (Optuna's gRPC proxy) in
front of the real PostgreSQL: the proxy alone holds the database URL and
its password, and nothing shows the password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

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
    spawn,
)

pytestmark = pytest.mark.timeout(300)


def test_two_workers_share_a_study_through_one_proxy(postgres, tmp_path):
    url = postgres.new_database()
    secret = "Zq9-pr0xy"
    port = _free_port()
    # From the environment: the password stays out of the process list.
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "QTUNE_STORAGE": url.replace("qtune@", f"qtune:{secret}@")}
    proxy = subprocess.Popen([sys.executable, "-m", "qtune", "storage-proxy", "--port",
                              str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        cfg = config(tmp_path, f"grpc://127.0.0.1:{port}", "proxied", trials=6)
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
