"""End to end against a real vLLM (the CPU build here), as a user runs it.

Each trial starts a real server (~35 s on 2 cores with --enforce-eager), so
these tests are few and their loads short.  They skip when vLLM is not
installed, unless QTUNE_REQUIRE_VLLM=1 (set by .ci/run) makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from qtune.profile import Profile
from tests.emit import readback as rb

ROOT = Path(__file__).parent.parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("QTUNE_REQUIRE_VLLM") == "1":
    raise RuntimeError("QTUNE_REQUIRE_VLLM=1 but vLLM is not importable")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed"),
]

# Every process a test starts carries this mark in its environment, so the
# checks below see only this run's servers, not another vLLM on the machine.
MARK = f"qtune-e2e-{os.getpid()}"

LOAD = ["--concurrency", "4", "--requests", "24", "--warmup", "4",
        "--input-len", "128", "--output-len", "32"]


def qtune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "QTUNE_TEST_MARK": MARK}
    return subprocess.run([sys.executable, "-m", "qtune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def vllm_servers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        # The server and its engine processes (which rename themselves);
        # not qtune's own probe, whose inline script mentions vllm.
        if not any(k in cmd for k in ("vllm.entrypoints", "EngineCore", "VLLM::")):
            continue
        try:
            if p.environ().get("QTUNE_TEST_MARK") == MARK:
                out.append(p)
        except psutil.Error:
            pass
    return out


def wait_gone(timeout: float = 40) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := vllm_servers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_search_profile_emit_and_resume(tmp_path):
    r = qtune("search", "--trials", "3", "--study", "e2e", "--json", "--confirm-top", "2",
              "--confirm-repeats", "1", *LOAD, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    launched = [t for t in res["trials"] if t["status"] != "invalid"]
    assert len(launched) == 3
    assert launched[0]["baseline"] and launched[0]["status"] == "ok"
    ok = [t for t in launched if t["status"] == "ok"]
    for t in ok:
        s = t["summary"]
        assert s["completed"] == 24 and s["failed"] == 0
        assert s["e2e_ms"]["p99"] >= s["e2e_ms"]["p50"] > 0
        assert s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p50"] > 0
        assert Path(t["log"]).is_file()
    profile = Profile.load(Path(res["profile"]))
    assert profile.engine.name == "vllm" and profile.engine.build == "cpu"
    assert profile.metrics["baseline"]["trial"] == 0
    assert profile.metrics["objective"]["best"] <= profile.metrics["objective"]["baseline"]
    assert "--port" in profile.argv and profile.model["load_format"] == "dummy"
    # The two best configs and the engine defaults were re-measured with a
    # fresh start each; the winner is the best median, with every value kept.
    # (Pruned trials are no candidates: with one fully measured feasible
    # trial, it is confirmed alone; with none, nothing is.)
    full = [t for t in ok if t["feasible"]]
    conf = profile.metrics["confirmation"]
    if len(full) >= 2:
        base = {t["number"] for t in full if t["baseline"]}
        top2 = {t["number"] for t in sorted(full, key=lambda t: t["value"])[:2]}
        assert set(conf) == {str(n) for n in top2 | base}
        assert all(len(c["values"]) == 2 for c in conf.values())
        assert str(profile.study.trial) in conf
    elif full:
        assert set(conf) == {str(full[0]["number"])}
        assert len(conf[str(full[0]["number"])]["values"]) == 2
    else:
        assert conf is None
    assert (tmp_path / "studies" / "e2e" / "trials.csv").is_file()
    assert wait_gone(10) == []

    unit = tmp_path / "qtune-e2e.service"
    # The test's model cache is under /tmp (QTUNE_CACHE), which the unit's
    # PrivateTmp= would hide: refused as it is, emitted with /tmp visible.  As
    # root, so that the reach check (which judges the venv's python and differs
    # between a checkout under /tmp and one elsewhere) does not speak first.
    r = qtune("emit", res["profile"], "--format", "systemd", "--user", "root",
              "-o", str(unit), cwd=tmp_path)
    assert r.returncode == 1 and "PrivateTmp" in r.stderr and not unit.exists(), r.stderr
    r = qtune("emit", res["profile"], "--format", "systemd", "--user", "root", "--allow-tmp",
              "-o", str(unit), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    if shutil.which("systemd-analyze"):
        rb.assert_systemd_verifies(unit)

    # A/B against the engine defaults with fresh starts.
    r = qtune("verify", res["profile"], "--repeat", "1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    v = json.loads(r.stdout)
    assert v["against"] == "defaults" and v["failed_requests"] == {"profile": 0,
                                                                   "defaults": 0}
    row = v["metrics"]["e2e_p99"]
    assert row["gain"]["ratio"] == pytest.approx(
        row["defaults"]["median"] / row["profile"]["median"])
    assert wait_gone(10) == []

    # Resume: one more launch, no second baseline.
    r = qtune("search", "--trials", "4", "--study", "e2e", "--json", "--confirm-top", "0",
              *LOAD, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res2 = json.loads(r.stdout)
    launched2 = [t for t in res2["trials"] if t["status"] != "invalid"]
    assert len(launched2) == 4
    assert sum(t["baseline"] for t in res2["trials"]) == 1
    assert wait_gone(10) == []


def test_pareto_levels_share_one_server_per_launch(tmp_path):
    """--levels: two launches (the defaults and one tuned config), each
    measured at 1 and 4 streams on its own one server."""
    assert LOAD[:2] == ["--concurrency", "4"]
    load = LOAD[2:]  # the levels replace the concurrency
    r = qtune("search", "--trials", "2", "--study", "lv", "--json",
              "--objective", "pareto:e2e_p50", "--levels", "1,4", *load, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    launches = [t for t in res["trials"] if t["status"] != "invalid"
                and t["server_of"] is None]
    points = [t for t in res["trials"] if t["server_of"] is not None]
    assert len(launches) == 2 and len(points) == 2
    assert len(list((tmp_path / "studies" / "lv").glob("trial-*.log"))) == 2
    for p in points:
        own = next(t for t in launches if t["number"] == p["server_of"])
        assert (p["load_level"], own["load_level"]) == (1.0, 4.0)
        assert p["log"] == own["log"] and p["params"] == own["params"]
        assert p["summary"]["completed"] == 24 and p["summary"]["failed"] == 0
        # One stream against four on the engine defaults' server: less
        # throughput.  Not asserted for the sampled config: on 2 cores one
        # may not scale from one stream to four at all (seen in CI: 9.41
        # req/s at one stream, 9.32 at four), and noise then decides.
        if own["status"] == "ok" and own["baseline"]:
            assert p["values"][0] < own["values"][0]
    assert res["pareto_front"] and Path(res["profile"]).is_file()
    assert wait_gone(10) == []


def test_startup_failure_is_recorded_and_the_study_goes_on(tmp_path):
    # A KV cache far larger than the host.  First with the memory check: the
    # config is predicted not to fit and never launched; only the baseline
    # (engine defaults) runs.
    (tmp_path / "space.yaml").write_text("VLLM_CPU_KVCACHE_SPACE: [100000]\n")
    args = ["--trials", "2", "--space", "space.yaml", "--study", "kv", "--json",
            "--confirm-top", "0", *LOAD]
    r = qtune("search", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    skipped = [t for t in res["trials"] if t["reason"] == "predicted_oom"]
    assert skipped and all(t["status"] == "invalid" for t in skipped)
    assert [t["status"] for t in res["trials"] if t["status"] != "invalid"] == ["ok"]
    assert res["memory_estimate"]["launches_avoided"] == len(skipped)
    # Then launched anyway: the real start fails, classified from its log,
    # and the study goes on to write the baseline's profile.
    r = qtune("search", *args, "--no-memory-check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    failed = [t for t in res["trials"] if t["status"] == "startup_failed"]
    assert len(failed) == 1 and failed[0]["reason"] == "oom", res["trials"]
    assert "less than requested memory" in failed[0]["detail"]
    assert res["best"]["baseline"]
    acc = res["memory_estimate"]
    assert acc["prediction_right"] == acc["launched_with_prediction"] == 2
    assert wait_gone(10) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_server_outlives_qtune(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QTUNE_TEST_MARK": MARK}
    p = subprocess.Popen([sys.executable, "-m", "qtune", "search", "--trials", "2",
                          "--study", "sig", "--confirm-top", "0", *LOAD], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not vllm_servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_servers(), "no server started"
    time.sleep(3)  # mid-startup
    p.send_signal(sig)
    rc = p.wait(timeout=60)
    assert wait_gone(40) == []
    if sig == signal.SIGINT:
        assert rc == 130
        assert "Traceback" not in p.stderr.read()
        # The interrupted trial is closed, so a resume does not see it RUNNING.
        r = qtune("search", "--trials", "1", "--study", "sig", "--json",
                  "--confirm-top", "0", *LOAD, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        states = [t["status"] for t in json.loads(r.stdout)["trials"]]
        assert "ok" in states
