"""``qtune report`` leads with the answer (issue 29): the recommendation in
the text report, the HTML page and ``--json``; the trials table with params
first and the winner highlighted; plots with ticks, units, trial numbers and
distinct marks for trials without a value; a fleet's lost trials with the
retry that replaced them; strict JSON."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
from pathlib import Path

import optuna
import pytest

from qtune.jsonout import dumps
from qtune.plots import ticks
from qtune.recommendation import launch_flags, recommend, workload_text
from qtune.report import load_study, report
from qtune.search import open_storage
from qtune.search.records import Attr, StudyAttr, TrialRecord, TrialStatus, write_record

FIXTURES = Path(__file__).parent / "fixtures"
RUN6 = FIXTURES / "h200-run6" / "h200-journal.log"
RUN11 = FIXTURES / "h200-engines-run11" / "eng.log"


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def run6(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    shutil.copy(RUN6, tmp_path / "studies" / "h200-qwen3-4b.log")
    return tmp_path


def test_run6_recommends_the_winner_with_its_gain(run6):
    res = report("h200-qwen3-4b", None, html_path=run6 / "r.html")
    rec = res["recommendation"]
    assert rec["trial"] == 1 and rec["flags"] == ["--data-parallel-size 2"]
    f = rec["figure"]
    assert f["unit"] == "ms" and f["metric"] == "e2e_p99"
    assert f["ratio"] == pytest.approx(12853.66 / 2293.46, rel=1e-3)
    assert not f["confirmed"] and "no confirmation" in f["why_not_confirmed"]
    assert "random weights" in rec["quality"]
    assert rec["emit_command"] == "qtune emit profiles/h200-qwen3-4b.yaml --format systemd"
    assert rec["measured_on"]["workload"].startswith("40 req/s (poisson arrivals)")
    # strict JSON: the table's gaps (NaN in pandas) are null
    doc = _strict(dumps(res))
    assert doc["trials"][2]["value"] is None

    page = (run6 / "r.html").read_text()
    # the answer comes first, then the table, then the plots
    assert page.index("Recommendation") < page.index("<h2>Trials") < page.index("<svg")
    assert "5.60x" in page and "not confirmed" in page and "--format systemd" in page
    assert '<tr class="winner">' in page and 'class="scroll"' in page
    groups = re.search(r"<thead><tr>(.*?)</tr>", page).group(1)
    spans = re.findall(r'<th colspan="(\d+)" class="group">(.*?)</th>', groups)
    assert [label for _, label in spans] == ["trial", "config: launch parameters", "measured"]
    head = re.search(r'<tr class="names">(.*?)</tr>', page).group(1)
    cols = re.findall(r"<th>(.*?)</th>", head)
    assert cols[:4] == ["trial", "status", "reason", "data_parallel_size"]
    # the groups span every column, the parameters exactly
    assert sum(int(n) for n, _ in spans) == len(cols)
    # the parameters' group ends where the measured columns start
    assert int(spans[1][0]) > 0 and cols[3 + int(spans[1][0])] == "value"
    body = page[page.index("<tbody>"):page.index("</tbody>")]
    assert "True" not in body and "False" not in body and "e-0" not in body
    # ticks and units on the history's axes, trial labels, the pruned trial
    history = page[page.index('aria-label="optimisation history'):]
    history = history[:history.index("</svg>")]
    assert "e2e_p99 (ms)" in history and ">10,000</text>" in history
    assert 'fill="#ff7f0e"' in history and "cannot beat the best" in history  # pruned
    assert "pruned (stopped early)" in page  # the legend says which mark is which
    assert "{'input_len'" not in page  # the workload is not a Python dict


def test_text_report_leads_with_the_recommendation(run6, monkeypatch):
    import qtune.console as console

    buf = io.StringIO()
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=80))
    res = report("h200-qwen3-4b", None)
    console.render_recommendation(res["recommendation"])
    console.render_report(res)
    text = buf.getvalue()
    assert text.startswith("Recommendation\nrun trial 1: 2,293 ms on e2e_p99")
    assert "5.60x" in text and "--data-parallel-size 2" in text
    # the deploy command on one line, pasted whole
    assert "  deploy:    qtune emit profiles/h200-qwen3-4b.yaml --format systemd\n" in text


def test_capacity_study_draws_brackets(tmp_path):
    study, url = load_study("h200-engines", f"journal://{RUN11}")
    from qtune.report import render_html
    from qtune.search.result import trials_frame

    page = render_html(study, url, trials_frame(study), {})
    assert "capacity: each trial&#x27;s bracket" in page or "bracket [held, failed)" in page
    rec = recommend(study)
    assert rec.figure is not None and rec.figure.unit == "req/s"
    assert rec.measured_on["accelerator"] == "1x NVIDIA H200"
    assert "probe 1: " in page  # how each bracket was found, probe by probe
    assert rec.figure.bracket is not None and rec.figure.decided


def test_fleet_lost_trial_shows_its_retry(tmp_path, monkeypatch):
    """A worker killed mid-trial leaves a FAIL trial with no record; the
    trial that re-ran it names it (retry_of, retry_reason).  The report
    shows both instead of status "unknown"."""
    from qtune.search.fleet import FleetAttr
    from qtune.search.result import trials_frame

    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="f", storage=open_storage(
        f"journal://{tmp_path / 'studies' / 'f.log'}"))
    study.set_user_attr(StudyAttr.OBJECTIVE, "e2e_p99")
    lost = study.ask()
    lost.set_user_attr(FleetAttr.WORKER, "host-a:11")
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    again = study.ask()
    again.set_user_attr(FleetAttr.WORKER, "host-b:22")
    again.set_user_attr(FleetAttr.RETRY_OF, lost.number)
    again.set_user_attr(FleetAttr.RETRY_REASON, "worker host-a:11 stopped beating")
    write_record(again, TrialRecord(again.number, {}, TrialStatus.OK, baseline=True,
                                    summary={"e2e_ms": {"p99": 100.0}, "failed": 0,
                                             "request_throughput": 1.0}))
    again.set_constraint("failed_requests", 0.0)
    study.tell(again, 100.0)
    df = trials_frame(study)
    first = df[df.trial == lost.number].iloc[0]
    assert first.status == "worker_lost" and first.retried_by == again.number
    assert "stopped beating" in first.detail and first.worker == "host-a:11"
    second = df[df.trial == again.number].iloc[0]
    assert second.retry_of == lost.number and second.worker == "host-b:22"
    res = report("f", None, html_path=tmp_path / "f.html")
    doc = _strict(dumps(res))
    assert {t["status"] for t in doc["trials"]} == {"worker_lost", "ok"}
    page = (tmp_path / "f.html").read_text()
    assert "re-run as trial 1" in page and "worker host-a:11" in page


def test_ticks_are_round_and_span_the_range():
    assert ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert ticks(2293, 12854) == [4000, 6000, 8000, 10000, 12000]
    assert ticks(0, 2, integer=True) == [0, 1, 2]


def test_workload_and_flags_read_as_text():
    assert workload_text({"concurrency": 8, "input_len": "128-512", "output_len": 64,
                          "requests": 100}) == (
        "8 concurrent streams, prompts of 128-512 tokens, outputs of 64 tokens, "
        "100 measured requests")
    rec = TrialRecord(3, {"max_num_seqs": 64, "enable_chunked_prefill": True,
                          "enable_prefix_caching": False,
                          "VLLM_CPU_KVCACHE_SPACE": 4}, TrialStatus.OK,
                      argv=["python", "-m", "vllm", "--model", "/m", "--port", "1",
                            "--max-num-seqs", "64", "--enable-chunked-prefill",
                            "--no-enable-prefix-caching"],
                      env={"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1"})
    assert launch_flags(rec) == ["--max-num-seqs 64", "--enable-chunked-prefill",
                                 "--no-enable-prefix-caching", "VLLM_CPU_KVCACHE_SPACE=4"]


def test_no_feasible_trial_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="n", storage=open_storage(
        f"journal://{tmp_path / 'studies' / 'n.log'}"))
    study.set_user_attr(StudyAttr.OBJECTIVE, "throughput")
    t = study.ask()
    write_record(t, TrialRecord(t.number, {}, TrialStatus.STARTUP_FAILED, baseline=True,
                                reason="oom", detail="out of memory"))
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    rec = report("n", None)["recommendation"]
    assert rec["trial"] is None and "no feasible trial" in rec["headline"]
    assert Attr.STATUS  # the records module's keys are what the report reads


def test_report_takes_a_journal_path_and_lists_studies(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "COLUMNS": "80"}

    def qtune(*args):
        return subprocess.run([sys.executable, "-m", "qtune", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    r = qtune("report", str(RUN6), "--json")
    assert r.returncode == 0, r.stderr
    doc = _strict(r.stdout)  # one strict object: no NaN for the pruned trial's gaps
    assert doc["study"] == "h200-qwen3-4b" and doc["recommendation"]["trial"] == 1
    r = qtune("report", "nope", "--storage", f"journal://{RUN6}")
    assert r.returncode == 1 and "studies there: h200-qwen3-4b" in r.stderr
    r = qtune("report", str(RUN6))
    assert r.stdout.startswith("Recommendation\nrun trial 1:")
    # -o/--out: the export its suffix names
    r = qtune("report", str(RUN6), "-o", "p.html", "--csv", "t.csv")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.html").read_text().startswith("<!doctype html>")
    assert (tmp_path / "t.csv").read_text().startswith("trial,")
    r = qtune("report", str(RUN6), "-o", "p.txt")
    assert r.returncode == 1 and ".html, .csv or .parquet" in r.stderr


@pytest.mark.parametrize(("objective", "x", "y"), [
    ("ttft_p99", "req_per_s", "ttft_p99_ms"),
    ("pareto:tpot_p99", "req_per_s", "tpot_p99_ms"),
    ("goodput", "value", "e2e_p99_ms"),
    ("output_throughput", "out_tok_per_s", "e2e_p99_ms"),
])
def test_the_tradeoff_plot_uses_the_objectives_own_axes(objective, x, y):
    from qtune.plots import tradeoff_axes as _tradeoff_axes

    assert _tradeoff_axes(objective)[::2] == (x, y)


def test_a_study_of_an_unknown_objective_still_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="o", storage=open_storage(
        f"journal://{tmp_path / 'studies' / 'o.log'}"))
    study.set_user_attr(StudyAttr.OBJECTIVE, "an_objective_of_the_future")
    t = study.ask()
    write_record(t, TrialRecord(t.number, {}, TrialStatus.OK, baseline=True,
                                summary={"e2e_ms": {"p99": 5.0}, "failed": 0,
                                         "request_throughput": 1.0}))
    t.set_constraint("failed_requests", 0.0)
    study.tell(t, 5.0)
    res = report("o", None, html_path=tmp_path / "o.html")
    assert res["recommendation"]["kept_defaults"]


def test_the_recommendation_names_the_slo_closest_to_its_limit():
    """Run 15 on one H200: the defaults' capacity stopped at TPOT p99 19.4 ms
    against 20 (97%), TTFT at 43% of its limit; the first screen says which
    limit binds, from the stored checks of the winner's run."""
    from qtune.recommendation import slo_headroom

    summary = {"goodput": {"checks": {
        "ttft_p99<=500ms": {"value": 215.3, "met": True},
        "tpot_p99<=20ms": {"value": 19.4, "met": True},
        "not an slo": {"value": 1.0, "met": True}}}}
    rows = slo_headroom(summary)
    assert rows == ["tpot_p99 19.4 ms against <= 20 ms (97% of the limit), the closest",
                    "ttft_p99 215.3 ms against <= 500 ms (43% of the limit)"]
    broken = slo_headroom({"goodput": {"checks": {"e2e_p99<=3000ms": {"value": 3600.0,
                                                                     "met": False}}}})
    assert broken == ["e2e_p99 3,600 ms against <= 3000 ms (120% of the limit, broken)"]
    assert slo_headroom(None) == [] and slo_headroom({"goodput": {}}) == []
    # no figure (nothing completed, a NaN): broken, and said so first
    nan = slo_headroom({"goodput": {"checks": {"ttft_p99<=500ms": {"value": float("nan")},
                                               "tpot_p99<=20ms": {"value": 10.0}}}})
    assert nan[0] == "ttft_p99: no value against <= 500 ms (broken), the closest"


def test_a_reason_is_clipped_at_a_word_in_tooltips_and_whole_in_the_list(tmp_path):
    from qtune.plots import trial_why as _why

    class R:
        trial, status, reason = 3, "pruned", "below_incumbent"
        detail = "did not hold 26.4 req/s " + "x " * 150 + "it cannot win, so one probe decided"
        worker = retry_of = retried_by = None

    tip = _why(R())
    assert tip.endswith("…") and "it cannot wi" not in tip and len(tip) < 260
    assert _why(R(), None).endswith("it cannot win, so one probe decided")


def test_the_first_screen_says_when_the_trials_ran_and_what_became_of_them():
    from qtune.recommendation import ran_text

    st = optuna.create_study(direction="maximize")
    assert ran_text(st) == "no trial ran"
    st.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={Attr.STATUS: "ok"}))
    for _ in range(2):
        st.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED,
                                               user_attrs={Attr.STATUS: "pruned"}))
    text = ran_text(st)
    assert re.fullmatch(r"trials ran \d{4}-\d\d-\d\d \d\d:\d\d-\d\d:\d\d \(\d+\.\d min\): "
                        r"1 ok, 2 pruned", text), text


def test_a_winner_confirmed_without_the_defaults_beside_it_is_not_a_confirmed_gain(
        tmp_path, monkeypatch):
    """The defaults broke the SLO in the search, so the confirmation
    re-measured the one feasible config alone: the figure is its confirmed
    median, and the gain over the defaults is not called confirmed."""
    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="a", direction="minimize", storage=open_storage(
        f"journal://{tmp_path / 'studies' / 'a.log'}"))
    study.set_user_attr(StudyAttr.OBJECTIVE, "e2e_p99")
    for n, (value, ok) in enumerate(((9000.0, False), (2000.0, True))):
        t = study.ask()
        t.set_constraint("e2e_p99<=3000ms", -1.0 if ok else 1.0)
        write_record(t, TrialRecord(t.number, {} if n == 0 else {"max_num_seqs": 8},
                                    TrialStatus.OK, baseline=n == 0, value=value))
        study.tell(t, value)
    study.set_user_attr(StudyAttr.CONFIRMATION, {"1": {
        "values": [2000.0, 2400.0], "fresh": [2400.0], "median": 2400.0, "failures": 0,
        "ci95": None}})
    rec = report("a", None)["recommendation"]
    assert rec["trial"] == 1 and rec["figure"]["best"] == 2400.0
    assert not rec["figure"]["confirmed"]
    assert "not re-measured beside it" in rec["figure"]["why_not_confirmed"]


def test_one_fresh_run_a_side_is_no_interval():
    """The quickstart confirms with one fresh run each: a range of one value
    is no interval, so none is printed ([1.25, 1.25] was); two runs a side
    give one."""
    import optuna

    from qtune.search.gain import gain_interval, one_run_a_side
    from qtune.search.records import StudyAttr, TrialRecord, TrialStatus

    study = optuna.create_study()
    best, base = (TrialRecord(n, {}, TrialStatus.OK) for n in (1, 0))
    study.set_user_attr(StudyAttr.CONFIRMATION, {
        "1": {"median": 1732.3, "fresh": [1732.3], "values": [1732.3]},
        "0": {"median": 2164.7, "fresh": [2164.7], "values": [2164.7]}})
    assert gain_interval(study, best, base, maximize=False) is None
    assert one_run_a_side(study, best, base)
    # the defaults not confirmed, or the winner the defaults: no interval
    # either, and not for having one run a side
    assert not one_run_a_side(study, best, TrialRecord(2, {}, TrialStatus.OK))
    assert not one_run_a_side(study, base, base)
    study.set_user_attr(StudyAttr.CONFIRMATION, {
        "1": {"median": 1750.0, "fresh": [1700.0, 1800.0]},
        "0": {"median": 2150.0, "fresh": [2100.0, 2200.0]}})
    lo, hi = gain_interval(study, best, base, maximize=False)
    assert lo == pytest.approx(2100 / 1800) and hi == pytest.approx(2200 / 1700)
    assert not one_run_a_side(study, best, base)


def test_two_runs_a_side_apart_say_how_often_chance_does_that():
    """Two fresh runs a side are judged on ranges: every winner's run
    beating every defaults' run happens by chance 1 time in 6 when the runs
    are alike (the quickstart from a clean clone printed 1.01x [1.01, 1.02],
    'confirmed', on 1,517.8 and 1,521.2 ms against 1,537.8 and 1,546.0)."""
    import optuna

    from qtune.search.gain import chance_apart
    from qtune.search.records import StudyAttr, TrialRecord, TrialStatus

    study = optuna.create_study()
    best, base = (TrialRecord(n, {}, TrialStatus.OK) for n in (1, 0))

    def confirm(w: list[float], b: list[float]) -> None:
        study.set_user_attr(StudyAttr.CONFIRMATION, {
            "1": {"median": sorted(w)[len(w) // 2], "fresh": w},
            "0": {"median": sorted(b)[len(b) // 2], "fresh": b}})

    confirm([1517.8, 1521.2], [1537.8, 1546.0])
    assert chance_apart(study, best, base) == (2, 2, pytest.approx(1 / 6))
    confirm([1517.8, 1521.2], [1537.8])
    assert chance_apart(study, best, base) == (2, 1, pytest.approx(1 / 3))
    # one run a side has its own words; three or more a side get an interval
    confirm([1517.8], [1537.8])
    assert chance_apart(study, best, base) is None
    confirm([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert chance_apart(study, best, base) is None
    assert chance_apart(study, base, base) is None


def test_the_recommendation_states_the_chance_of_two_runs_apart():
    """The basis a reader sees carries it: 'by chance 1 time in 6'."""
    import optuna

    from qtune.recommendation import recommend
    from qtune.search.records import StudyAttr, TrialRecord, TrialStatus, write_record

    study = optuna.create_study(study_name="q", direction="minimize")
    study.set_user_attr(StudyAttr.OBJECTIVE, "e2e_p99")
    for n, value in enumerate((1540.0, 1519.0)):
        t = study.ask()
        write_record(t, TrialRecord(t.number, {} if n == 0 else {"max_num_seqs": 8},
                                    TrialStatus.OK, baseline=n == 0, value=value))
        study.tell(t, value)
    study.set_user_attr(StudyAttr.CONFIRMATION, {
        "1": {"values": [1519.0, 1517.8, 1521.2], "fresh": [1517.8, 1521.2],
              "median": 1519.5, "failures": 0, "ci95": [1517.8, 1521.2]},
        "0": {"values": [1540.0, 1537.8, 1546.0], "fresh": [1537.8, 1546.0],
              "median": 1541.9, "failures": 0, "ci95": [1537.8, 1546.0]}})
    rec = recommend(study)
    assert rec.figure is not None
    assert "by chance 1 time in 6" in rec.figure.basis, rec.figure.basis


def test_one_fresh_run_a_side_is_judged_on_every_start():
    """One fresh run a side says nothing of the noise, so the gain is judged
    on every start's run, the search's included: the quickstart from a clean
    clone (2026-12-06) called 1.02x "confirmed" on 2,401.4 against 2,444.4
    ms, where each config's own two starts differed by more (2,263.9 and
    2,356.9 in the search)."""
    import optuna

    from qtune.recommendation import recommend
    from qtune.search.records import StudyAttr, TrialRecord, TrialStatus, write_record

    def study_of(win: list[float], base: list[float]) -> optuna.Study:
        study = optuna.create_study(study_name="q", direction="minimize")
        study.set_user_attr(StudyAttr.OBJECTIVE, "e2e_p99")
        for n, value in enumerate((base[0], win[0])):
            t = study.ask()
            write_record(t, TrialRecord(t.number, {} if n == 0 else {"max_num_seqs": 4},
                                        TrialStatus.OK, baseline=n == 0, value=value))
            study.tell(t, value)
        study.set_user_attr(StudyAttr.CONFIRMATION, {
            "1": {"values": win, "fresh": win[1:], "median": win[1], "failures": 0,
                  "ci95": None},
            "0": {"values": base, "fresh": base[1:], "median": base[1], "failures": 0,
                  "ci95": None}})
        return study

    rec = recommend(study_of([2263.9, 2401.4], [2356.9, 2444.4]))
    assert rec.figure is not None and not rec.figure.confirmed
    assert "NOT confirmed" in rec.headline
    why = rec.figure.why_not_confirmed or ""
    assert "2,264-2,401" in why and "2,357-2,444" in why and "noise" in why, why
    # every start of the winner beats every start of the defaults: confirmed,
    # and still no interval from one fresh run a side
    rec = recommend(study_of([1700.0, 1750.0], [2100.0, 2164.7]))
    assert rec.figure is not None and rec.figure.confirmed, rec.figure.why_not_confirmed
    assert rec.figure.interval is None and "too few for an interval" in rec.figure.basis


@pytest.mark.parametrize("rival", [None, TrialStatus.OK, TrialStatus.PRUNED,
                                   TrialStatus.INVALID])
def test_defaults_alone_are_not_said_to_have_beaten_anything(tmp_path, monkeypatch, rival):
    """GPU run 21: a time budget kept the rest for the confirmation and the
    study launched only the defaults; its report said "no config beat them".
    A refused (invalid) config was never measured either."""
    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="d", storage=open_storage(
        f"journal://{tmp_path / 'studies' / 'd.log'}"))
    summary = {"e2e_ms": {"p99": 5.0}, "failed": 0, "request_throughput": 1.0}
    for n, status in enumerate([TrialStatus.OK, *([rival] if rival else [])]):
        t = study.ask()
        write_record(t, TrialRecord(t.number, {"x": n}, status, baseline=n == 0,
                                    summary=summary if n == 0 or status == TrialStatus.OK
                                    else None))
        t.set_constraint("failed_requests", 0.0)
        if n == 0 or status == TrialStatus.OK:
            study.tell(t, 5.0 if n == 0 else 9.0)
        elif status == TrialStatus.PRUNED:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
    res = report("d", None, html_path=tmp_path / "d.html")
    rec = res["recommendation"]
    compared = rival in (TrialStatus.OK, TrialStatus.PRUNED)
    assert rec["kept_defaults"] and rec["rivals"] == int(compared)
    assert ("no config beat them" in rec["headline"]) == compared
    assert ("no other config was measured" in rec["headline"]) != compared
    page = (tmp_path / "d.html").read_text()
    assert ("no other config was measured" in page) != compared


RUN24 = FIXTURES / "h100-run24" / "study.log"


def _run24_copy() -> optuna.Study:
    """Run 24's study in memory, to be written to."""
    mem = optuna.storages.InMemoryStorage()
    optuna.copy_study(from_study_name="h200-trialcost",
                      from_storage=open_storage(f"journal://{RUN24}", read_only=True),
                      to_storage=mem)
    return optuna.load_study(study_name="h200-trialcost", storage=mem)


def test_the_slo_line_reads_the_load_the_profile_plans_with(monkeypatch):
    """Run 24 on one H100: the defaults held 24 req/s in the search (TPOT
    p99 15.2 ms), failed 24 on their fresh start and held 16, where vLLM's
    own client read TPOT p99 15.9 ms.  The profile plans with 16, so the SLO
    line must not read the search's run at 24 as if it were that load's."""
    src, _ = load_study("h200-trialcost", f"journal://{RUN24}")
    rec = recommend(src)
    assert rec.figure is not None and rec.figure.bracket == (16.0, 24.0)
    # the journal predates the fresh start's checks: the search's run, said
    # to be above the load planned with
    assert rec.slo_basis == "its search run at 24 req/s, above the 16 req/s the profile " \
        "plans with"
    assert rec.slo[0].startswith("tpot_p99 15.25 ms")

    # the confirmation as qtune now records it: the fresh start's run at 16
    from types import SimpleNamespace

    from qtune.search import confirm

    study = _run24_copy()
    checks = {"ttft_p99<=500ms": {"value": 90.5, "met": True},
              "tpot_p99<=20ms": {"value": 14.1, "met": True}}
    fresh = {"capacity": {"found": True, "value": 16.0, "bracket": [16.0, 24.0],
                          "steps": [{"load": 24.0, "ok": False}, {"load": 16.0, "ok": True}]},
             "goodput": {"checks": checks}}

    def remeasure(prep, top, repeats, reporter, *, on_run, **kw):
        for r in top:
            on_run(r, fresh)
        return {r.number: [16.0] for r in top}, {r.number: 0 for r in top}

    monkeypatch.setattr(confirm, "remeasure", remeasure)
    prep = SimpleNamespace(cfg=SimpleNamespace(objective="capacity", time_budget=None,
                                               confirm=SimpleNamespace(top=1, repeats=1)),
                           engines={})
    confirm.confirm_top(prep, study, reporter=None, k=1, repeats=1)
    assert study.user_attrs["confirmation"]["0"]["at_held"] == {"load": 16.0,
                                                               "checks": checks}
    rec = recommend(study)
    assert rec.slo_basis == "its fresh start at 16 req/s"
    assert rec.slo == ["tpot_p99 14.1 ms against <= 20 ms (70% of the limit), the closest",
                       "ttft_p99 90.5 ms against <= 500 ms (18% of the limit)"]
    # every window's verdict, the search's 7 and the fresh start's 2, read
    # as noisy ones: 24 held once and failed once, so the capacity lies
    # between the 16 held on the fresh start and the 27 that failed
    v = rec.figure.from_verdicts
    assert v is not None and v.windows == 9 and 16.0 < v.low < v.median < 27.0 < v.high * 1.1
    import qtune.console as console

    buf = io.StringIO()
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=200))
    console.render_recommendation(rec.to_dict())
    assert f"verdicts:  {v.text('req/s')}" in buf.getvalue()
    from qtune.report import recommendation_html

    assert f"verdict</b>: {html.escape(v.text('req/s'))}</li>" in recommendation_html(rec)


def test_the_first_screen_says_a_capacity_as_the_profile_has_it(tmp_path, monkeypatch):
    """The CPU study of this stop confirmed 2.375 req/s; the figure line read
    "capacity 2.4 req/s" beside "2.375 req/s" in the line above it."""
    import qtune.console as console
    from qtune.recommendation import value_text

    assert value_text(2.375, "req/s") == "2.375 req/s"
    assert value_text(12853.66, "ms") == "12,854 ms"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    shutil.copy(RUN24, tmp_path / "studies" / "h200-trialcost.log")
    buf = io.StringIO()
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=200))
    res = report("h200-trialcost", None)
    fig = res["recommendation"]["figure"]
    fig["best"] = fig["baseline"] = 2.375
    console.render_recommendation(res["recommendation"])
    text = buf.getvalue()
    assert "figure:    capacity 2.375 req/s against the defaults' 2.375 req/s: 1.00x" in text
    assert "slo:       (its search run at 24 req/s, above the 16 req/s the profile plans " \
        "with) tpot_p99 15.25 ms" in text
