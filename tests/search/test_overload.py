"""A latency study at a rate no config serves measures a queue: the run says
so (``qtune.bench.falls_behind``), and the trial line, the profile's notes and
the search's summary say it beside the figures.  Seen on the H200 (SGLang
0.5.17, Qwen3-4B shape, 40 req/s offered): the engine defaults and the winner
both served ~26 req/s, and their E2E p99 (20.3 s against 11.4 s) was the
backlog of an 800-request run."""

from __future__ import annotations

import dataclasses
import random

from qtune.bench import falls_behind
from qtune.capacity import judge_load
from qtune.measure import replace_measure_server
from qtune.metrics import OVERLOAD_MEANS
from qtune.options import Confirmation
from qtune.profile import Profile
from qtune.search.replay import StandIn
from qtune.search.reporter import NullReporter
from qtune.search.runner import run_study
from tests.search.test_replay import build_tiny


def run_at(share: float, held: tuple[float, float] = (100.0, 110.0),
           ttft: tuple[float, float] = (150.0, 1.2)) -> dict:
    """A run's summary at 40 req/s offered over a 20 s arrival window."""
    return {"completed": 800, "failed": 0, "saturated": False,
            "ttft_ms": {"p50": ttft[0]},
            "keeps_up": {"window_s": 20.0, "served_share": share, "held_growth": held[1] / held[0],
                         "held_mid": held[0], "held_last": held[1], "ttft_growth": ttft[1]}}


def test_a_run_that_serves_less_than_offered_fell_behind():
    # the H200 defaults' run: 0.265 of 40 req/s over the window's last two thirds
    assert falls_behind(run_at(0.265), 40.0) == \
        "served 10.60 of 40.00 req/s over the arrival window"
    assert "queue growing: 100.0 -> 200.0" in falls_behind(run_at(1.0, (100, 200)), 40.0)
    assert "TTFT trending up: 3.0x" in falls_behind(run_at(1.0, ttft=(150, 3.0)), 40.0)


def test_a_run_that_keeps_up_or_has_no_rate_did_not():
    assert falls_behind(run_at(0.97), 40.0) is None  # within the 10% allowance
    assert falls_behind(run_at(0.5), None) is None  # a concurrency load: no rate
    assert falls_behind({"completed": 3}, 40.0) is None  # too few requests to tell


def test_the_capacity_judge_reads_the_same_signals():
    ok, why, kind = judge_load(run_at(0.5), [], 40.0)
    assert (ok, kind) == (False, "soft") and why == falls_behind(run_at(0.5), 40.0)
    assert judge_load(run_at(1.0), [], 40.0) == (True, "SLO met, kept up", "ok")


def test_the_profile_says_the_winner_and_the_defaults_were_overloaded(
        monkeypatch, cpu_host, tmp_path):
    tiny = build_tiny(monkeypatch, cpu_host, tmp_path)
    for runs in tiny.table.runs.values():
        for r in runs:  # as qtune.bench.measure marks a run that fell behind
            r.summary["overloaded"] = "served 25.80 of 40.00 req/s over the arrival window"
    prep = tiny.prep
    stand = StandIn(tiny.table, lambda p: prep.engine.launch_spec(
        p, prep.ctx, host="127.0.0.1", port=0), random.Random(0))

    def answer(spec, log, bench, **kw):
        return stand.measure(spec, watch=kw.get("watch"), on_ready=kw.get("on_ready"),
                             before=kw.get("before"))

    with replace_measure_server(answer):
        res = run_study(dataclasses.replace(prep, cfg=dataclasses.replace(
            prep.cfg, trials=4, confirm=Confirmation(top=0))), NullReporter())
    assert res.best is not None and res.profile_path is not None
    (note,) = [n for n in Profile.load(res.profile_path).notes if n.startswith("overloaded")]
    why = "served 25.80 of 40.00 req/s over the arrival window"
    if res.baseline is not None and res.best.number == res.baseline.number:
        said = f"the engine defaults (kept) {why}"  # one run, said once
    else:
        said = f"the engine defaults {why}; the winner {why}"
    assert note == f"overloaded: {said}: {OVERLOAD_MEANS}"
