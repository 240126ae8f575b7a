"""The capacity search (qtune.capacity): its procedure with each probe's
outcome scripted, and against a stand-in server whose capacity is known
(one engine with a queue, tests.fakes.queue: ~100 req/s)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.bench import BenchConfig
from qtune.capacity import (
    FAST,
    FULL,
    CapacityPlan,
    CapacityResult,
    find_capacity,
    judge_load,
)
from qtune.load.workload import Workload
from qtune.objectives import parse_slo
from tests.fakes.queue import queue_server

SLO = parse_slo("ttft_p99<=400ms")


def _summary(verdict: bool | str, w: Workload, stopped: str | None = None) -> dict[str, Any]:
    """A probe's summary as qtune.bench.measure returns it, shaped so that
    the real judge_load reads ``verdict``: True held, False a broken SLO,
    "soft" only a keeping-up signal."""
    n = w.requests or 10
    ttft = 100.0 if verdict is not False else 1000.0
    done = n if stopped is None else max(1, n // 5)
    return {
        "completed": done, "failed": 0, "saturated": False, "stopped_early": stopped,
        "request_throughput": float(w.rate or 1.0) * (0.5 if verdict is False else 1.0),
        "ttft_ms": {"p50": ttft / 2, "p90": ttft, "p99": ttft, "mean": ttft},
        "tpot_ms": None, "itl_ms": None,
        "e2e_ms": {"p50": 50.0, "p90": 60.0, "p99": 70.0, "mean": 50.0},
        "output_token_throughput": 1.0,
        "keeps_up": {"served_share": 0.5 if verdict == "soft" else 1.0, "window_s": 20.0,
                     "held_growth": 1.0, "held_mid": 4.0, "held_last": 4.0,
                     "ttft_growth": 1.0},
    }


class Scripted:
    """``holds(rate, n)`` says whether the n-th probe at ``rate`` holds; the
    probes it was asked for are kept (workload and watcher)."""

    def __init__(self, holds: Any, abort_failures: bool = False) -> None:
        self.holds, self.abort = holds, abort_failures
        self.seen: dict[float, int] = {}
        self.calls: list[tuple[Workload, Any]] = []

    def __call__(self, url: str, model: str, w: Workload, cfg: Any, **kw: Any) -> dict:
        self.seen[w.rate] = self.seen.get(w.rate, 0) + 1
        self.calls.append((w, kw.get("watch")))
        v = self.holds(w.rate, self.seen[w.rate])
        stopped = "breaks SLO: certain" if (v is False and self.abort
                                            and kw.get("watch") is not None) else None
        return _summary(v, w, stopped)


def run(holds: Any, plan: CapacityPlan | None = None, abort: bool = False,
        rate: float = 4, requests: int = 10, seed: int = 0) -> tuple[CapacityResult, Scripted]:
    fn = Scripted(holds, abort)
    cfg = BenchConfig(urls=["u"], workload=Workload(rate=rate, requests=requests, seed=seed),
                      slo=SLO)
    return find_capacity("u", "m", cfg, plan=plan, measure_fn=fn), fn


def test_capacity_falls_back_to_a_load_that_passed_before():
    """Near the knee a short run passes or fails by luck: loads in (64, 76]
    pass once and then fail.  The re-measure must fall back to a load that
    passed before (64) rather than creep down 5% at a time into more luck, and
    report only a load it measured as holding."""
    cap, _ = run(lambda rate, n: rate <= 64 or (rate <= 76 and n == 1))
    assert cap.found and cap.value == 64
    assert cap.at_value is cap.probes[-1] and cap.at_value.held and cap.at_value.load == 64
    assert cap.bracket is not None and cap.bracket[1] > 64


def test_a_failed_re_measure_is_bisected_again_not_left_wide():
    """One H200, SGLang's defaults: 30 req/s passed its first short probe,
    failed the re-measure, and the answer fell back to the last pass below,
    20, bracket [20, 30).  Here loads up to 28 hold and (28, 34] pass once by
    luck; the bracket after the fallback is bisected again."""
    cap, _ = run(lambda rate, n: rate <= 28 or (rate <= 34 and n == 1))
    assert cap.found and cap.value == 28 and cap.at_value and cap.at_value.load == 28
    lo, hi = cap.bracket
    assert (hi - lo) / lo <= 0.1, cap.bracket
    # every reported capacity was held on a re-measure twice as long
    assert cap.at_value.remeasure and cap.at_value.requests == 2 * max(
        p.requests for p in cap.probes if p.load == 28 and p is not cap.at_value)


def test_capacity_not_found_when_no_load_holds_on_re_measure():
    cap, _ = run(lambda rate, n: n == 1 and rate < 50)  # every load passes once only
    assert not cap.found and cap.value is None and "re-measured" in cap.reason
    assert "value" not in cap.to_dict()


def test_capacity_probes_never_reuse_prompts():
    """Before issue 13 every probe used the workload's seed, so from the
    second one on every prompt was in the prefix cache (H200: hit rate
    0.984, capacity read 1.5x too high)."""
    cap, fn = run(lambda rate, n: rate <= 10, seed=3)
    seeds = [w.seed for w, _ in fn.calls]
    assert cap.found and len(seeds) >= 4 and len(set(seeds)) == len(seeds)
    # The re-measure runs twice the window of the probes.
    assert cap.at_value.requests >= 2 * 4 * 20 * 0.9


def test_a_soft_failure_is_measured_again_before_it_decides():
    """The first probe after a start, or one near the knee, can read "queue
    growing" by transient or noise (one H200: the defaults' first probe at 16
    req/s).  Such a failure is re-run with fresh prompts; only a repeat
    counts.  A hard failure (an SLO broken) decides at once."""
    cap, _ = run(lambda rate, n: "soft" if rate == 4 and n == 1 else rate <= 16)
    assert cap.found and cap.value >= 16
    first, second = cap.probes[0], cap.probes[1]
    assert first.load == second.load == 4
    assert not first.held and first.why.endswith("measured again") and second.held
    cap, _ = run(lambda rate, n: "soft" if rate > 8 else True)  # a repeat decides
    assert cap.found and cap.value <= 8


# --- issue 27: a losing config costs one probe -------------------------------


def test_a_config_below_the_incumbent_costs_one_probe():
    """After the baseline, a config is probed first at the best capacity so
    far; one that does not hold there cannot win (issue 27: on one H200 such
    a config still took 10 probes, 7.4 minutes, to learn it was worse)."""
    plan = CapacityPlan(start=4, floor=22, window_s=30.0, floor_of="trial 0")
    cap, fn = run(lambda rate, n: rate <= 14, plan=plan)
    assert not cap.found and cap.below == 22 and len(cap.probes) == 1
    assert "trial 0" in cap.reason and "cannot win" in cap.reason
    # the incumbent's window, not the workload's own: a comparable probe
    w, _ = fn.calls[0]
    assert w.rate == 22 and w.requests == 22 * 30
    assert cap.summary_at_value() is cap.probes[0].summary


def test_a_config_that_holds_the_incumbent_is_searched_upward_from_it():
    plan = CapacityPlan(start=4, floor=20, window_s=20.0)
    cap, fn = run(lambda rate, n: rate <= 27, plan=plan)
    assert cap.found and 24 <= cap.value <= 27
    loads = [w.rate for w, _ in fn.calls]
    # the floor, then up by its headroom (TTFT p99 100 ms of 400: double)
    assert loads[0] == 20 and loads[1] == 40
    assert min(loads) >= 20  # nothing below the floor is probed again
    lo, hi = cap.bracket
    assert (hi - lo) / lo <= 0.1


@pytest.mark.parametrize(("ttft_p99", "factor"), [(100.0, 2.0), (300.0, 1.5), (390.0, 1.25)])
def test_the_step_up_follows_the_headroom(ttft_p99, factor):
    """Far below the SLO's limits the next probe doubles; near them it goes
    a quarter higher (each step skipped is a probe of 40-55 s on the H200)."""
    loads: list[float] = []

    def fn(url: str, model: str, w: Workload, cfg: Any, **kw: Any) -> dict:
        loads.append(w.rate)
        s = _summary(w.rate <= 30, w)
        if w.rate <= 30:
            s["ttft_ms"]["p99"] = ttft_p99
        return s

    cfg = BenchConfig(urls=["u"], workload=Workload(rate=8, requests=10), slo=SLO)
    find_capacity("u", "m", cfg, measure_fn=fn)
    assert loads[1] == pytest.approx(8 * factor)


def test_the_full_procedure_ignores_the_floor_and_never_stops_a_probe_early():
    plan = CapacityPlan(start=4, floor=22, window_s=30.0, procedure=FULL)
    cap, fn = run(lambda rate, n: rate <= 14, plan=plan, abort=True)
    assert cap.found and cap.below is None and fn.calls[0][0].rate == 4
    assert all(watch is None for _, watch in fn.calls)


def test_fast_and_full_agree_on_a_knee():
    """The fast procedure's answer lies within the full one's bracket, on a
    server whose knee is sharp (the CPU and H200 side-by-side runs are in
    benchmarks/capacity_fast_vs_full.py)."""
    knee = 23.0
    full, ffull = run(lambda rate, n: rate <= knee, plan=CapacityPlan(start=4, procedure=FULL))
    fast, ffast = run(lambda rate, n: rate <= knee, abort=True)
    lo, hi = full.bracket
    assert lo <= fast.value < hi and fast.value <= knee < fast.bracket[1]
    assert len(ffast.calls) <= len(ffull.calls)


def test_a_probe_that_cannot_pass_is_stopped_and_the_time_it_saved_counted():
    """A probe stops as soon as its failure is certain (never early as
    passed); the arrivals it did not send are counted as saved."""
    cap, fn = run(lambda rate, n: rate <= 10, abort=True)
    aborted = [p for p in cap.probes if p.aborted]
    assert aborted and all(not p.held for p in aborted)
    assert all("failure certain" in p.why for p in aborted)
    assert all(p.saved_s > 0 for p in aborted) and cap.saved_s == sum(p.saved_s for p in aborted)
    assert all(watch is not None for _, watch in fn.calls)
    d = cap.to_dict()
    assert d["saved_s"] > 0 and any(st.get("aborted") for st in d["steps"])


def test_judge_load_reads_a_stopped_probe_as_a_certain_failure():
    s = _summary(True, Workload(rate=4, requests=10), stopped="breaks SLO ttft_p99<=400ms")
    held, why, kind = judge_load(s, SLO, 4.0)
    assert (held, kind) == (False, "hard") and "failure certain" in why
    # the pile-up stop ("saturated") keeps its own verdict
    s = {**_summary(True, Workload(rate=4, requests=10)), "stopped_early": "saturated",
         "saturated": True}
    assert judge_load(s, SLO, 4.0) == (False, "saturated (requests piled up)", "hard")


def test_a_confirmation_is_one_sustained_probe_at_the_capacity():
    """One probe over twice the search's window: on one H200 (run 16) the
    defaults held 26.4 req/s over one window on their fresh start, and vLLM's
    own client broke the SLO there over two."""
    plan = CapacityPlan(start=22, floor=22, window_s=20.0, confirm=True)
    cap, fn = run(lambda rate, n: True, plan=plan)
    assert cap.found and cap.value == 22 and len(fn.calls) == 1
    assert fn.calls[0][0].requests == 22 * 20 * 2 and cap.at_value.remeasure
    cap, _ = run(lambda rate, n: False, plan=plan)
    assert not cap.found and cap.below == 22 and "fresh start" in cap.reason


def test_a_confirmation_that_fails_falls_back_one_rung_on_the_same_start():
    """Run 13 on one H200: the winner's 27.5 req/s, held once in its search,
    broke its TPOT limit on the fresh start; 25 had held in the search.  The
    confirmation probes the fallback on the same start, and the answer is
    what held there, with the load that did not hold as its upper end."""
    plan = CapacityPlan(start=27.5, floor=27.5, window_s=20.0, confirm=True, fallback=25)
    cap, fn = run(lambda rate, n: rate <= 25, plan=plan)
    assert [w.rate for w, _ in fn.calls] == [27.5, 25]
    assert [w.requests for w, _ in fn.calls] == [27.5 * 40, 25 * 40]  # two windows each
    assert cap.found and cap.value == 25 and cap.bracket == (25, 27.5)
    assert "27.5 req/s did not hold on a fresh start" in cap.decided and "25 req/s held" \
        in cap.decided
    cap, fn = run(lambda rate, n: False, plan=plan)
    assert not cap.found and cap.below == 27.5 and "nor did 25" in cap.reason
    # one that holds its load never spends the fallback
    cap, fn = run(lambda rate, n: True, plan=plan)
    assert cap.value == 27.5 and len(fn.calls) == 1


def test_a_confirmation_whose_fallback_is_far_below_probes_between_them():
    """Run 24 on one H100: the defaults failed 24 req/s on their fresh start
    and held the fallback, 16, where vLLM's own client put the limit near 20.
    With ``refine`` a fallback more than two tolerances below is followed by
    one probe halfway, and the answer and bracket are what that leaves; a
    close fallback, no ``refine`` or no time left spend nothing more."""
    import time

    plan = CapacityPlan(start=24, floor=24, window_s=20.0, confirm=True, fallback=16,
                        refine=True)
    cap, fn = run(lambda rate, n: rate <= 21, plan=plan)
    assert [w.rate for w, _ in fn.calls] == [24, 16, 20]
    assert all(w.requests == w.rate * 40 for w, _ in fn.calls)  # two windows each
    assert cap.found and cap.value == 20 and cap.bracket == (20, 24)
    assert cap.at_value is cap.probes[-1] and "so did 20 between them" in cap.decided
    cap, fn = run(lambda rate, n: rate <= 18, plan=plan)
    assert [w.rate for w, _ in fn.calls] == [24, 16, 20]
    assert cap.value == 16 and cap.bracket == (16, 20) and cap.at_value.load == 16
    assert "20 between them did not" in cap.decided
    # nothing more: a fallback within two tolerances, refine off, no time left,
    # or a fallback that did not hold
    for p in (dataclasses.replace(plan, fallback=20), dataclasses.replace(plan, refine=False),
              dataclasses.replace(plan, deadline=time.monotonic() - 1.0)):
        cap, fn = run(lambda rate, n: rate <= 21, plan=p)
        assert [w.rate for w, _ in fn.calls] == [24, p.fallback]
        assert cap.bracket == (p.fallback, 24)
    cap, fn = run(lambda rate, n: False, plan=plan)
    assert len(fn.calls) == 2 and not cap.found
    # "two tolerances" are the plan's: at 30% a 50% gap is not wide
    cap, fn = run(lambda rate, n: rate <= 21, plan=dataclasses.replace(plan, tolerance=0.3))
    assert [w.rate for w, _ in fn.calls] == [24, 16]
    # a figure to plan with, not a float's last digit (on the CPU target)
    cap, fn = run(lambda rate, n: rate <= 2,
                  plan=dataclasses.replace(plan, floor=2.4, start=2.4, fallback=0.7))
    assert cap.value == 1.55 and cap.bracket == (1.55, 2.4)


def test_a_config_that_fails_its_re_measure_at_the_floor_is_below_it():
    """A config that holds the incumbent's capacity once and not on the
    re-measure cannot win: the search stops there, below the floor, instead
    of bisecting under it (19 probes on 2 busy cores)."""
    plan = CapacityPlan(start=4, floor=20, window_s=20.0)
    cap, fn = run(lambda rate, n: rate <= 20 and n == 1, plan=plan)
    assert not cap.found and cap.below == 20 and "re-measure" in cap.reason
    assert all(w.rate >= 20 for w, _ in fn.calls)
    assert cap.probes[-1].remeasure and cap.probes[-1].load == 20  # it stopped there


def test_only_a_probe_after_one_stopped_early_waits_for_an_idle_server():
    """A probe stopped once its failure was certain leaves its requests on
    the server: the next probe waits for them; other probes do not wait
    (SGLang refreshes its gauges on an idle server every 30 s)."""
    seen = []
    fn2 = Scripted(lambda rate, n: rate <= 20, abort_failures=True)

    def spy(url: str, model: str, w: Workload, cfg: Any, **kw: Any) -> dict:
        seen.append((w.rate, kw.get("wait_idle")))
        return fn2(url, model, w, cfg, **kw)

    cfg = BenchConfig(urls=["u"], workload=Workload(rate=4, requests=10), slo=SLO)
    find_capacity("u", "m", cfg, plan=CapacityPlan(start=4, floor=20, window_s=20.0),
                  measure_fn=spy)
    assert seen[0] == (20, False) and seen[1][1] is False  # nothing stopped before
    failed = [i for i, (rate, _) in enumerate(seen) if rate > 20]
    assert failed and all(seen[i + 1][1] is True for i in failed if i + 1 < len(seen))
    assert all(w is False for i, (_, w) in enumerate(seen) if i and i - 1 not in failed)


def test_a_plan_is_checked():
    with pytest.raises(ValueError):
        CapacityPlan(start=1, procedure="quick")
    with pytest.raises(ValueError):
        CapacityPlan(start=1, confirm=True)
    for fallback in (0, 27.5, 30):  # a fallback is a lower rung of a confirmation
        with pytest.raises(ValueError):
            CapacityPlan(start=27.5, floor=27.5, confirm=True, fallback=fallback)
    with pytest.raises(ValueError):
        CapacityPlan(start=27.5, floor=27.5, fallback=25)
    with pytest.raises(ValueError):  # a middle rung refines a confirmation's fallback
        CapacityPlan(start=27.5, floor=27.5, confirm=True, refine=True)


# --- against a server whose capacity is known --------------------------------


@pytest.fixture(scope="module")
def server():
    with queue_server() as url:
        yield url


@pytest.mark.slow
@pytest.mark.measures  # a probe's abort depends on the stand-in's measured latency
def test_find_capacity_brackets_the_queue_limit(server):
    cfg = BenchConfig(urls=[server], workload=Workload(
        input_len=8, output_len=2, rate=10, requests=60, warmup_requests=0,
        arrival="constant"), slo=parse_slo("e2e_p99<=100ms"), capacity_window=1.0)
    cap = find_capacity(server, "queue-model", cfg)
    assert cap.found, cap.to_dict()
    # Above 100 req/s the queue grows without bound; far below, latency is
    # one service time.  The answer must lie between.
    assert 15 <= cap.value <= 110, cap.to_dict()
    lo, hi = cap.bracket
    assert lo == cap.value and (hi is None or hi > lo)
    assert cap.at_value.held  # re-measured at the answer
    assert any(not p.held for p in cap.probes)  # the bracket was closed
    # a probe far above the knee stopped once its failure was certain
    assert any(p.aborted and p.saved_s > 0 for p in cap.probes)


def test_capacity_needs_a_latency_slo(server):
    from qtune.errors import InputError

    with pytest.raises(InputError):
        find_capacity(server, "m", BenchConfig(urls=[server], workload=Workload(
            rate=1, requests=2)))


def test_a_held_load_near_the_limits_is_bisected_one_tolerance_up():
    """When lo held close to the SLO's limits, the knee is near: the next
    probe goes one tolerance above lo (here 5.5 of [5, 7.5)), which closes
    the bracket if it fails."""
    loads: list[float] = []

    def fn(url: str, model: str, w: Workload, cfg: Any, **kw: Any) -> dict:
        loads.append(w.rate)
        s = _summary(w.rate <= 5.2, w)
        if w.rate <= 5.2:
            s["ttft_ms"]["p99"] = 350.0  # 88% of the 400 ms limit
        return s

    cfg = BenchConfig(urls=["u"], workload=Workload(rate=4, requests=10), slo=SLO)
    cap = find_capacity("u", "m", cfg, measure_fn=fn)
    assert loads[:3] == [4, 5.0, 6.25]  # 4 held near the limit: 1.25x, then 1.25x again
    assert cap.found and cap.value == 5.0 and cap.bracket == (5.0, 5.5)
    assert loads[3] == pytest.approx(5.5) and len(loads) == 5  # and the re-measure


def test_the_time_budget_stops_a_search_with_what_held():
    """A deadline (--time-budget less the confirmation's reserve) ends the
    search before a probe that would overrun it: the highest load that held
    is kept, unre-measured, and says so; the first probe always runs."""
    import time

    soon = CapacityPlan(start=4, floor=20, window_s=20.0, deadline=time.monotonic() + 5)
    cap, fn = run(lambda rate, n: rate <= 27, plan=soon)
    assert len(fn.calls) == 1 and cap.found and cap.value == 20
    assert cap.bracket == (20, None) and "time budget" in cap.note
    # nothing held yet: no capacity, and why
    cap, fn = run(lambda rate, n: False, plan=CapacityPlan(start=4, deadline=time.monotonic()))
    assert len(fn.calls) == 1 and not cap.found and "time budget" in cap.reason
    # room enough: the whole search, re-measure included
    far = CapacityPlan(start=4, floor=20, window_s=20.0, deadline=time.monotonic() + 3600)
    cap, fn = run(lambda rate, n: rate <= 27, plan=far)
    assert cap.found and cap.note is None and any(p.remeasure for p in cap.probes)


def test_a_study_that_confirms_later_checks_a_new_floor_once_and_never_bisects_again():
    """Under --time-budget the confirmation re-measures the top configs on
    fresh starts, so a trial's search ends at the tolerance and does not
    re-measure and re-bisect its answer.  An answer that becomes the next
    trials' floor still gets one probe over twice the window (run 22: the
    defaults' 26.4 req/s held one window, cut six configs in one probe each,
    and failed on its fresh start and under vLLM's own client)."""
    holds = lambda rate, n: rate <= 27  # noqa: E731
    cap, fn = run(holds, plan=CapacityPlan(start=4, floor=20, window_s=20.0, remeasure=False))
    assert cap.found and cap.value is not None and 20 < cap.value <= 27
    lo, hi = cap.bracket or (None, None)
    assert lo == cap.value and hi is not None and (hi - lo) / lo <= 0.1 + 1e-9
    checks = [p for p in cap.probes if p.remeasure]
    assert [p.load for p in checks] == [cap.value] and cap.probes[-1] is checks[0]
    assert cap.at_value is checks[0] and "over a re-measure" in (cap.decided or "")
    assert "fresh start" in (cap.note or "")
    # with room for it, the full re-measure ends at the same answer
    full, fn_full = run(holds, plan=CapacityPlan(start=4, floor=20, window_s=20.0))
    assert full.value == cap.value and len(fn_full.calls) == len(fn.calls)


def test_a_failed_check_falls_back_to_the_load_held_below_without_bisecting():
    """Loads up to 24 hold; 25 and 26 hold one window and fail over two.  The
    check at the answer fails: the answer is the highest load that held below
    it, held once, and no probe follows the failed check."""
    holds = lambda rate, n: rate <= 24 or (rate <= 26 and n == 1)  # noqa: E731
    cap, fn = run(holds, plan=CapacityPlan(start=16, remeasure=False))
    assert cap.probes[-1].remeasure and not cap.probes[-1].held
    assert sum(p.remeasure for p in cap.probes) == 1
    checked = cap.probes[-1].load
    assert cap.found and cap.value is not None and cap.value < checked
    assert cap.bracket == (cap.value, checked)
    assert cap.at_value is not None and not cap.at_value.remeasure
    assert "held once" in (cap.decided or "")
    assert f"{checked:g} req/s held once but not on its re-measure" in (cap.note or "")


def test_an_answer_that_only_ties_the_floor_is_not_checked():
    """A config that held the floor and nothing above it cannot win: no probe
    over twice the window is spent on it."""
    cap, fn = run(lambda rate, n: rate <= 20.5, plan=CapacityPlan(
        start=4, floor=20, window_s=20.0, remeasure=False))
    assert cap.found and cap.value == 20 and not any(p.remeasure for p in cap.probes)
    assert "held once" in (cap.decided or "")


def test_a_challenger_whose_check_fails_down_to_the_floor_ties_it():
    """Above the floor only the answer held, and it fails its check: what is
    left is the floor, held once, a tie that cannot win."""
    holds = lambda rate, n: rate <= 20 or (rate <= 22 and n == 1)  # noqa: E731
    cap, fn = run(holds, plan=CapacityPlan(start=4, floor=20, window_s=20.0, remeasure=False))
    assert cap.probes[-1].remeasure and not cap.probes[-1].held
    assert cap.found and cap.value == 20 and cap.bracket == (20, cap.probes[-1].load)


def test_verdicts_that_go_either_way_are_reported_as_a_noise_band():
    """Near the knee one probe's verdict is luck (one H200: TPOT p99 14.9,
    19.4 and 20.5 ms at one load against 20).  Loads in (8, 9] pass once and
    then fail: the result names the band where a lower load failed while a
    higher one held, in its JSON and in the words that decided it."""
    cap, _ = run(lambda rate, n: rate <= 8 or (rate <= 9 and n == 1))
    assert cap.found and cap.noise_band is not None
    lo, hi = cap.noise_band
    assert lo <= cap.bracket[1] and hi > cap.value
    assert lo <= hi
    assert cap.to_dict()["noise_band"] == {"lowest_failed": lo, "highest_held": hi}
    assert (f"between {lo:g} and {hi:g} req/s" if lo < hi else f"at {lo:g} req/s") in cap.decided
    # the soft failure measured again is marked, and is no failure of the band
    soft, _ = run(lambda rate, n: "soft" if rate == 4 and n == 1 else rate <= 16)
    assert soft.to_dict()["steps"][0].get("retried") is True


def test_a_load_that_held_and_then_failed_its_re_measure_is_a_band_of_one_load():
    """The plainest flip: 8 held over the window and failed over twice it."""
    cap, _ = run(lambda rate, n: rate < 8 or (rate == 8 and n == 1))
    assert cap.found and cap.noise_band is not None
    lo, hi = cap.noise_band
    assert lo <= 8 <= hi


def test_a_monotone_search_has_no_noise_band_and_a_retried_soft_failure_is_no_failure():
    cap, _ = run(lambda rate, n: "soft" if rate == 4 and n == 1 else rate <= 16)
    assert cap.found and cap.noise_band is None
    assert "noise_band" not in cap.to_dict() and "either way" not in cap.decided


def test_a_probe_step_keeps_what_its_failed_requests_said():
    """A probe decided by failed requests keeps their errors in its step
    (a verdict alone cannot tell a dropped connection from an engine's
    failure); a probe without failures has neither key."""
    def holds(rate: float, n: int) -> bool:
        return rate < 8

    cap, _ = run(holds)
    broken = {**_summary(False, Workload(rate=8, requests=10)), "failed": 2,
              "errors": {"ServerDisconnectedError: Server disconnected": 2}}
    from qtune.capacity_types import Probe

    step = Probe(8.0, False, "2 failed requests", "hard", 10, 1.0, broken).to_dict()
    assert step["failed"] == 2
    assert step["errors"] == {"ServerDisconnectedError: Server disconnected": 2}
    assert all("errors" not in st and "failed" not in st for st in cap.to_dict()["steps"])


@settings(max_examples=40, deadline=None)
@given(start=st.floats(0.1, 50), knee=st.floats(0.05, 200), fast=st.booleans())
def test_every_load_a_search_asks_for_has_four_digits(start, knee, fast):
    """Steps of 1.1x asked for 1.2100000000000002 req/s in a CPU search's
    JSON: every load probed, in either procedure, is what a user would type."""
    plan = CapacityPlan(start=start, procedure=FAST if fast else FULL)
    cap, fn = run(lambda rate, n: rate <= knee, plan=plan, rate=start)
    for p in cap.probes:  # (the start load is the user's, as given)
        assert p.load == start or p.load == float(f"{p.load:.4g}")


def test_a_search_reads_its_capacity_from_every_verdict_with_an_interval():
    """Every probe's verdict, read as a noisy one (qtune.stats.capacity_from_
    verdicts), gives the capacity with a 90% interval that a flip near the
    knee moves a little, where it moves the bracket a rung."""
    cap, _ = run(lambda rate, n: rate <= 8 or (rate <= 9 and n == 1))
    v = cap.to_dict()["from_verdicts"]
    lo, hi = v["ci90"]
    assert lo <= v["median"] <= hi and v["windows"] == sum(not p.retried for p in cap.probes)
    assert lo <= cap.value and hi >= cap.bracket[1] * 0.95
    # a search that never failed has no interval: nothing bounds it above
    assert "from_verdicts" not in run(lambda rate, n: True)[0].to_dict()
