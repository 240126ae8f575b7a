from __future__ import annotations

import os

import optuna
import pytest
from optuna.distributions import IntDistribution

from qtune.errors import InputError, StudyError
from qtune.report import report
from qtune.search import open_storage
from qtune.search.records import Attr, StudyAttr, TrialRecord, TrialStatus, write_record


def _study(tmp_path, monkeypatch):
    """A study as the search stores it: every trial's attributes through the
    search's own writer, so a change on the writer's side reaches the report."""
    monkeypatch.chdir(tmp_path)
    url = f"journal://{tmp_path / 'studies' / 's.log'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    study.set_user_attr(StudyAttr.OBJECTIVE, "e2e_p99")
    for seqs, e2e in [(None, 400.0), (8, 300.0), (64, 250.0), (16, 350.0), (32, None)]:
        t = study.ask({"max_num_seqs": IntDistribution(4, 256)} if seqs else {})
        params = {"max_num_seqs": seqs} if seqs else {}
        if e2e is None:
            write_record(t, TrialRecord(
                t.number, params, TrialStatus.STARTUP_FAILED, reason="oom",
                detail="No available memory for the cache blocks"))
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        write_record(t, TrialRecord(
            t.number, params, TrialStatus.OK, baseline=seqs is None,
            summary={"e2e_ms": {"p50": e2e / 2, "p99": e2e},
                     "request_throughput": 1000.0 / e2e, "failed": 0}))
        t.set_constraint("failed_requests", 0.0)
        study.tell(t, e2e)
    # A design point queued but never run (the budget ended first).
    study.enqueue_trial({"max_num_seqs": 100}, user_attrs={Attr.DESIGN: "latin-hypercube"})
    return study


def test_the_records_read_back_what_the_writer_stored(tmp_path, monkeypatch):
    from qtune.search.records import ran_trials

    recs = [TrialRecord.from_frozen(t) for t in ran_trials(_study(tmp_path, monkeypatch))]
    assert [r.status for r in recs] == ["ok"] * 4 + ["startup_failed"]
    assert [r.baseline for r in recs] == [True, False, False, False, False]
    assert recs[1].params == {"max_num_seqs": 8} and recs[1].summary["e2e_ms"]["p99"] == 300
    assert recs[4].reason == "oom" and recs[4].value is None and not recs[4].feasible


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


def test_report_and_search_pick_the_same_winner(tmp_path, monkeypatch):
    """Once the top configs were re-measured, the winner is the best median
    of the confirmation runs (trial 1 here), not the best first run (trial 2):
    the report names the trial the search wrote as the profile."""
    from qtune.search import winner

    study = _study(tmp_path, monkeypatch)
    study.set_user_attr(StudyAttr.CONFIRMATION, {
        "1": {"values": [300.0, 260.0, 270.0], "median": 270.0, "failures": 0},
        "2": {"values": [250.0, 320.0, 330.0], "median": 320.0, "failures": 0},
        # the best median, but a re-run failed: it cannot win over clean ones
        "3": {"values": [350.0, 200.0], "median": 200.0, "failures": 1},
    })
    assert winner(study).number == 1
    assert report("s", None)["best_trial"] == 1
    assert winner(study, pick=2).number == 2  # --pick names a trial itself


def test_report_unknown_study_lists_known(tmp_path, monkeypatch):
    _study(tmp_path, monkeypatch)
    with pytest.raises(StudyError) as e:
        report("nope", None)
    assert "s" in e.value.hint


def test_report_sqlite_is_read_only(tmp_path, monkeypatch):
    """An existing database is read, never written; a missing one (or its
    folder) is an error, not a new empty database."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.db"
    study = optuna.create_study(study_name="s", storage=open_storage(f"sqlite:///{db}"))
    study.set_user_attr("objective", "e2e_p99")
    before = (db.stat().st_mtime_ns, db.stat().st_size)
    res = report("s", f"sqlite:///{db}")
    assert res["study"] == "s" and (db.stat().st_mtime_ns, db.stat().st_size) == before
    with pytest.raises(StudyError, match="no storage file"):
        report("s", f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(StudyError, match="does not exist"):
        report("s", f"sqlite:///{tmp_path / 'new' / 'x.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_report_checks_every_target_first(tmp_path, monkeypatch):
    _study(tmp_path, monkeypatch)
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(InputError, match="folder"):
        report("s", None, csv=tmp_path / "t.csv", html_path=tmp_path / "dir.html")
    assert not (tmp_path / "t.csv").exists()  # nothing written before the refusal
    ro = tmp_path / "ro.csv"
    ro.write_text("old\n")
    ro.chmod(0o444)
    with pytest.raises(InputError, match="read-only"):
        report("s", None, csv=ro)
    report("s", None, csv=ro, force=True)
    assert ro.read_text().startswith("trial,") and not ro.stat().st_mode & 0o222


def test_torn_journal_refused_with_a_repair_that_works(tmp_path):
    from qtune.search import check_journal

    path = tmp_path / "s.log"
    optuna.create_study(study_name="s", storage=open_storage(f"journal://{path}")).ask()
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"op_code": 4, "wor')
    with pytest.raises(StudyError, match="partial record") as e:
        check_journal(path)
    assert path.read_bytes().endswith(b'"wor')  # refused, not touched
    size = int(e.value.hint.split("truncate -s ")[1].split()[0])
    assert size == len(whole)
    os.truncate(path, size)
    check_journal(path)
    assert len(optuna.load_study(study_name="s",
                                 storage=open_storage(f"journal://{path}")).trials) == 1



def test_trials_table_masks_tokens_in_failure_details():
    """A failure's detail is a server log line; a token in it never reaches
    the CSV (issue 14: secrets never land in a CSV)."""
    import optuna

    from qtune.search import trials_frame

    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params={}, distributions={},
        user_attrs={"status": "startup_failed", "reason": "crash",
                    "detail": "401 for token hf_abcdefghijklmnop", "launch_params": {}}))
    csv = trials_frame(study).to_csv(index=False)
    assert "hf_abcdefghijklmnop" not in csv and "***" in csv
