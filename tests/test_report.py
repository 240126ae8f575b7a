from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from qtune.errors import StudyError
from qtune.report import report
from qtune.search import open_storage


def _study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"journal://{tmp_path / 'studies' / 's.log'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    study.set_user_attr("objective", "e2e_p99")
    for seqs, e2e in [(None, 400.0), (8, 300.0), (64, 250.0), (16, 350.0), (32, None)]:
        t = study.ask({"max_num_seqs": IntDistribution(4, 256)} if seqs else {})
        if seqs is None:
            t.set_user_attr("baseline", True)
        if e2e is None:
            t.set_user_attr("status", "startup_failed")
            t.set_user_attr("reason", "oom")
            t.set_user_attr("detail", "No available memory for the cache blocks")
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        t.set_user_attr("status", "ok")
        t.set_user_attr("summary", {"e2e_ms": {"p50": e2e / 2, "p99": e2e},
                                    "request_throughput": 1000.0 / e2e, "failed": 0})
        t.set_constraint("failed_requests", 0.0)
        study.tell(t, e2e)
    # A design point queued but never run (the budget ended first).
    study.enqueue_trial({"max_num_seqs": 100}, user_attrs={"design": "latin-hypercube"})
    return study


def test_report_exports(tmp_path, monkeypatch):
    _study(tmp_path, monkeypatch)
    res = report("s", None, csv=tmp_path / "t.csv", html_path=tmp_path / "r.html")
    assert res["best_trial"] == 2
    assert res["counts"] == {"ok": 4, "startup_failed": 1}
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") >= 2 and "optimisation history" in page
    assert "No available memory for the cache blocks" in page
    assert "<script" not in page  # self-contained, nothing to fetch
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert len(rows) == 1 + 5  # the queued point is not a row
    header = rows[0]
    assert "param.max_num_seqs" in header and "e2e_p99_ms" in header


def test_report_unknown_study_lists_known(tmp_path, monkeypatch):
    _study(tmp_path, monkeypatch)
    with pytest.raises(StudyError) as e:
        report("nope", None)
    assert "s" in e.value.hint
