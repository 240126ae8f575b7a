"""Several workers on one study in a real PostgreSQL (conftest's server),
each a process of its own running the stand-in engine's real servers: the
study-wide budget, one baseline, one finish; a worker SIGKILLed mid-trial
(its trial re-queued with the reason, its server gone, nothing counted
twice); a database stopped mid-trial (the worker stops its server and
exits with one error line; a restarted worker completes the study); a
worker killed before its trial's first heartbeat."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from qtune.search.fleet import FleetAttr
from qtune.search.records import LAUNCHED, Attr, StudyAttr, TrialStatus
from qtune.search.storage import open_storage

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.timeout(300)


def config(tmp: Path, url: str, study: str, **kw: Any) -> dict[str, Any]:
    space = tmp / "space.yaml"
    # Every config starts (no crash) and launches (slots within the
    # adapter's limit); 30 ms a token makes a trial last seconds, long
    # enough to kill a worker in the middle of one.
    space.write_text("crash: false\nslots: {low: 1, high: 6}\ndelay_ms: 30\n")
    return {"study": study, "storage": url, "trials": 5, "seed": 3, "sampler": "random",
            "workload": {"input_len": 8, "output_len": 10, "concurrency": 2,
                         "requests": 24, "warmup_requests": 2},
            "studies_dir": str(tmp / "studies"), "profiles_dir": str(tmp / "profiles"),
            "space_file": str(space), "confirm_top": 1, "confirm_repeats": 1,
            "startup_timeout": 60, "heartbeat": 1, "prune_margin": 1.0, **kw}


def spawn(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.fleet.worker", json.dumps(cfg)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen[str], timeout: float = 180) -> tuple[int, dict[str, Any], str]:
    out, err = p.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    return p.returncode, (json.loads(lines[-1]) if p.returncode == 0 and lines else {}), err


def load(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def launched(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.user_attrs.get(Attr.STATUS) in LAUNCHED]


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def running_trial_of(url: str, name: str, pid: int, baseline_ok: bool = False,
                     baseline_only: bool = False) -> Any:
    """A RUNNING trial of worker ``pid`` whose fake server is up."""
    try:
        study = load(url, name)
    except KeyError:
        return None
    me = f"{socket.gethostname()}:{pid}"
    for t in study.get_trials(states=(TrialState.RUNNING,)):
        base = bool(t.user_attrs.get(Attr.BASELINE))
        if t.user_attrs.get(FleetAttr.WORKER) == me and (
                base if baseline_only else baseline_ok or not base):
            servers = [c for c in psutil.Process(pid).children(recursive=True)
                       if "tests.fakes.llm_server" in " ".join(c.cmdline())]
            if servers:
                return t, servers
    return None


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_share_one_study(postgres, tmp_path, workers):
    url = postgres.new_database()
    cfg = config(tmp_path, url, "shared", trials=6, confirm_top=2)
    procs = [spawn(cfg) for _ in range(workers)]
    results = [finish(p) for p in procs]
    for rc, _, err in results:
        assert rc == 0, err
    study = load(url, "shared")
    runs = launched(study)
    # The budget is the study's, not each worker's: 6 launches in all.
    assert len(runs) == 6
    assert sum(1 for t in runs if t.user_attrs.get(Attr.BASELINE)) == 1
    assert runs[0].user_attrs.get(Attr.BASELINE)  # before any sampled trial
    # Work was shared, and every trial says where it ran.
    ran_by = {t.user_attrs[FleetAttr.WORKER] for t in runs}
    assert len(ran_by) >= 2, ran_by
    assert all(t.user_attrs[FleetAttr.HOST_FACTS]["engine"] == "fake 1.0 (cpu)"
               for t in runs)
    # One worker confirmed and wrote the profile; the others did not.
    profiles = [r[1]["profile"] for r in results if r[1]["profile"]]
    assert len(profiles) == 1 and Path(profiles[0]).is_file()
    assert study.user_attrs.get(StudyAttr.CONFIRMATION)
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]


@pytest.mark.parametrize("when", ["sampled", "opening"])
def test_a_killed_workers_trial_is_requeued_and_its_server_stopped(postgres, tmp_path,
                                                                   when):
    """``opening``: the worker that created the study dies in its baseline;
    the other, waiting for the opening, takes it over."""
    url = postgres.new_database()
    cfg = config(tmp_path, url, "kill")
    victim = spawn(cfg)
    if when == "opening":
        wait_for(lambda: running_trial_of(url, "kill", victim.pid, baseline_only=True),
                 120, "the victim's baseline")
    other = spawn(cfg)
    trial, servers = wait_for(
        lambda: running_trial_of(url, "kill", victim.pid,
                                 baseline_only=when == "opening"), 120,
        "a trial of the victim with its server up")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # The guard sees qtune gone and stops the server's group (it polls each second).
    gone, alive = psutil.wait_procs(servers, timeout=20)
    assert not alive, [p.cmdline() for p in alive]
    rc, res, err = finish(other)
    assert rc == 0, err
    study = load(url, "kill")
    dead = study.trials[trial.number]
    assert dead.state == TrialState.FAIL and Attr.STATUS not in dead.user_attrs
    retries = [t for t in study.get_trials() if t.user_attrs.get(FleetAttr.RETRY_OF)
               == trial.number]
    assert len(retries) == 1
    retry = retries[0]
    assert retry.user_attrs.get(Attr.STATUS) in LAUNCHED
    assert str(victim.pid) in retry.user_attrs[FleetAttr.RETRY_REASON]
    assert retry.params == dead.params  # the same config, run again
    # Nothing lost, nothing counted twice: 5 launches, one of them the retry.
    assert len(launched(study)) == 5
    assert sum(1 for t in launched(study) if t.user_attrs.get(Attr.BASELINE)) == 1
    assert res["profile"] and Path(res["profile"]).is_file()
    # qtune report and trials.csv: the killed worker's trial is not "unknown"
    # but lost, with its worker and the trial that re-ran it, and the retry
    # with its retry_of and reason.
    from qtune.search.result import trials_frame

    df = trials_frame(study)
    lost = df[df.trial == trial.number].iloc[0]
    assert lost.status == "worker_lost" and lost.retried_by == retry.number
    assert str(victim.pid) in lost.worker and str(victim.pid) in lost.detail
    again = df[df.trial == retry.number].iloc[0]
    assert again.retry_of == trial.number and str(victim.pid) in again.retry_reason


def test_a_database_restart_stops_the_worker_and_a_restarted_one_resumes(
        postgres, tmp_path):
    url = postgres.new_database()
    cfg = config(tmp_path, url, "restart", trials=3)
    worker = spawn(cfg)
    trial, servers = wait_for(lambda: running_trial_of(url, "restart", worker.pid,
                                                       baseline_ok=True), 120,
                              "a trial with its server up")
    postgres.stop()
    try:
        out, err = worker.communicate(timeout=60)
        gone, alive = psutil.wait_procs(servers, timeout=20)
    finally:
        postgres.start()
    assert worker.returncode == 1, (out, err)
    # One line, no traceback, no driver noise.
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: lost the study's database postgresql://"), err
    assert not alive  # the worker stopped its server before it exited
    again = spawn(cfg)
    rc, res, err = finish(again)
    assert rc == 0, err
    study = load(url, "restart")
    assert study.trials[trial.number].state == TrialState.FAIL
    assert len(launched(study)) == 3
    assert [t.user_attrs.get(FleetAttr.RETRY_OF) for t in launched(study)].count(
        trial.number) == 1
    assert sum(1 for t in launched(study) if t.user_attrs.get(Attr.BASELINE)
               and t.user_attrs.get(Attr.STATUS) == TrialStatus.OK) == 1
    assert res["profile"]


def test_finish_confirms_a_study_and_a_worker_of_another_engine_is_refused(
        postgres, tmp_path):
    url = postgres.new_database()
    rc, _, err = finish(spawn(config(tmp_path, url, "nope", finish=True)))
    assert rc == 1 and "error: --finish: no study nope in postgresql://" in err
    rc, res, err = finish(spawn(config(tmp_path, url, "fin", trials=2, confirm_top=0)))
    assert rc == 0, err
    assert StudyAttr.CONFIRMATION not in load(url, "fin").user_attrs
    # The top 2 (and the defaults, one of them): at least two to confirm.
    rc, res, err = finish(spawn(config(tmp_path, url, "fin", trials=2, finish=True,
                                       confirm_top=2)))
    assert rc == 0, err
    study = load(url, "fin")
    assert len(study.user_attrs[StudyAttr.CONFIRMATION]) == 2
    assert len(launched(study)) == 2  # --finish launches no trial
    assert res["profile"] and Path(res["profile"]).is_file()
    # A re-pick writes its profile on a fleet's study too, on any host.
    rc, res, err = finish(spawn(config(tmp_path, url, "fin", pick=0, engine_version="2.0",
                                       out=str(tmp_path / "pick.yaml"))))
    assert rc == 0, err
    assert res["profile"] == str(tmp_path / "pick.yaml")
    # Another engine version: its numbers would not compare.
    rc, _, err = finish(spawn(config(tmp_path, url, "fin", trials=3,
                                     engine_version="2.0")))
    assert rc == 1 and "engine 'fake 1.0 (cpu)', this worker has 'fake 2.0 (cpu)'" in err
    assert len(launched(load(url, "fin"))) == 2


def test_a_short_database_restart_is_ridden_out(postgres, tmp_path):
    url = postgres.new_database()
    # 2 s beats: a worker gives the database up after 5 s without one.
    cfg = config(tmp_path, url, "blip", trials=3, heartbeat=2)
    worker = spawn(cfg)
    trial, _ = wait_for(lambda: running_trial_of(url, "blip", worker.pid,
                                                 baseline_ok=True), 120,
                        "a trial with its server up")
    postgres.stop()
    postgres.start()
    rc, res, err = finish(worker)
    assert rc == 0, err
    study = load(url, "blip")
    assert study.trials[trial.number].user_attrs.get(Attr.STATUS) in LAUNCHED
    assert len(launched(study)) == 3 and res["profile"]


def test_a_trial_whose_worker_died_before_its_first_beat_is_run_again(postgres, tmp_path):
    """A worker killed between asking for a trial and its first heartbeat
    left a RUNNING trial no heartbeat would ever call stale: the other
    workers waited for it for ever.  The password in the URL shows nowhere."""
    url = postgres.new_database()
    secret = "Zq9-s3cret"
    # The test server trusts every login: the password is sent, never checked.
    cfg = config(tmp_path, url.replace("qtune@", f"qtune:{secret}@"), "orphan",
                 trials=2, confirm_top=0)
    rc, _, err = finish(spawn(cfg))
    assert rc == 0, err
    study = optuna.load_study(study_name="orphan",
                              storage=open_storage(url, heartbeat_s=1))
    orphan = study.ask()  # ... and its worker is gone before beating it
    worker = spawn({**cfg, "trials": 3})
    try:
        out, err = worker.communicate(timeout=90)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    study = load(url, "orphan")
    assert study.trials[orphan.number].state == TrialState.FAIL
    runs = launched(study)
    assert len(runs) == 3
    assert sum(1 for t in runs if t.user_attrs.get(Attr.BASELINE)) == 1
    retry = [t for t in runs if t.user_attrs.get(FleetAttr.RETRY_OF) == orphan.number]
    assert len(retry) == 1 and "never beat it" in retry[0].user_attrs[FleetAttr.RETRY_REASON]
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    assert_secret_nowhere(secret, out + err, tmp_path)


def assert_secret_nowhere(secret: str, output: str, root: Path) -> None:
    """Not in the output, nor any file a study wrote (profile, trials.csv,
    logs)."""
    assert secret not in output
    for f in root.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
