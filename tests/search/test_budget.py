"""The time budget plans the confirmation from the first measured trial on
(issue 27, item 5): the search stops launching early enough for it, and
without flags that fix it, it is sized to fit the budget."""

from __future__ import annotations

import time

import optuna

from qtune.options import Confirmation
from qtune.search.budget import CONFIRM_SHARE, costs, over_budget, plan_confirmation
from qtune.search.config import TuneConfig
from qtune.search.records import Attr


def _study(trials: list[tuple[float, float, float]]) -> optuna.Study:
    """(total_s, startup_s, re-measure probe s) per measured capacity trial,
    the first the engine defaults' (probes of 40 s)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(direction="maximize")
    for i, (total, start, probe) in enumerate(trials):
        steps = [{"elapsed_s": 40.0}, {"elapsed_s": 40.0},
                 {"elapsed_s": probe, "remeasure": True}]
        st.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
            Attr.STATUS: "ok", Attr.TOTAL_S: total, Attr.STARTUP_S: start,
            **({Attr.BASELINE: True} if i == 0 else {}),
            Attr.SUMMARY: {"capacity": {"found": True, "at_value": {"elapsed_s": probe},
                                        "steps": steps}}}))
    return st


def with_contenders(n: int):
    """A confirmation's size with ``n`` configs beside the defaults: the
    best k of them and the defaults."""
    return lambda k: (min(k, n) + 1, min(k, n + 1) + 1)


def test_costs_leave_the_cold_first_start_out():
    st = _study([(480, 200, 60), (130, 70, 58), (150, 80, 62)])
    c = costs(st)
    assert c.start_s == 75 and c.trial_s == 140 and c.run_s == 40  # one probe's window
    # a confirmation's probe (and its fallback rung) lasts two windows: one
    # window held by luck near the knee (run 16 on one H200)
    assert c.confirm_run_s == 75 + 2 * 40 and c.fallback_s == 2 * 40


def test_before_any_trial_after_the_defaults_a_trial_is_a_start_and_two_probes():
    """The defaults' whole capacity search (here 8 min) is no later trial's
    cost: with a floor a config costs a start and a probe or two.  (The CPU
    smoke study stopped after the defaults alone, taking 5 min per trial.)"""
    c = costs(_study([(480, 200, 60)]))
    # the one start known is a cold one: half of it (H200: 165-247 s cold,
    # 60-120 s later)
    assert c.start_s == 100 and c.trial_s == 100 + 2 * 40


def test_the_confirmation_is_sized_to_the_budget():
    """H200, issue 27: a 20-minute budget, starts of ~75 s and a confirmation
    probe of ~40 s: the defaults' 3 x 2 plan (8 fresh starts, 15 min) cannot
    fit; the best config and the defaults once each, the smallest plan, is
    taken (6.5 min: each fresh start's probe and the fallback rung last two
    windows)."""
    st = _study([(480, 200, 60), (130, 70, 58), (150, 80, 62)])
    cfg = TuneConfig(time_budget=20 * 60)
    p = plan_confirmation(cfg, st, "maximize", with_contenders(2))
    # two fresh starts and one fallback rung (the defaults failing the winner's load)
    assert (p.top, p.repeats) == (1, 1) and p.seconds == 2 * (75 + 80) + 80
    assert "sized to the time budget" in p.why
    # (the smallest plan is kept even above the share: no answer is unconfirmed)
    assert p.seconds > CONFIRM_SHARE * cfg.time_budget
    # a budget large enough keeps the flags' size
    big = plan_confirmation(TuneConfig(time_budget=4 * 3600), st, "maximize", with_contenders(2))
    assert (big.top, big.repeats, big.why) == (3, 2, "")
    # flags given explicitly are kept, whatever they cost
    fixed = plan_confirmation(
        TuneConfig(time_budget=20 * 60, confirm=Confirmation(top=2, repeats=2, fixed=True)),
        st, "maximize", with_contenders(2))
    assert (fixed.top, fixed.repeats) == (2, 2)
    # no confirmation for a Pareto front, or with --confirm-top 0
    assert plan_confirmation(cfg, st, "pareto", with_contenders(2)).off
    assert plan_confirmation(TuneConfig(confirm=Confirmation(top=0)), st, "maximize",
                             with_contenders(2)).off


def test_the_search_stops_early_enough_to_pay_the_confirmation():
    st = _study([(480, 200, 60), (130, 70, 58), (150, 80, 62)])
    cfg = TuneConfig(time_budget=20 * 60)
    plan = plan_confirmation(cfg, st, "maximize", with_contenders(2))
    now = time.monotonic()
    # 10 minutes in: a trial (140 s) and the reserve (390 s) still fit in 10
    assert over_budget(cfg, st, now - 10 * 60, plan) is None
    # 12.5 minutes in: they do not (530 s > 450 s)
    why = over_budget(cfg, st, now - 12.5 * 60, plan)
    assert why is not None and "kept for the confirmation" in why
    assert over_budget(TuneConfig(), st, now - 10**6, plan) is None  # no budget


def test_a_capacity_launch_is_priced_as_a_loser_and_its_search_ends_in_time():
    """Run 12 on one H200: the defaults (cold start 224 s, probes of ~33 s)
    then one winner (start 98 s, 5.0 min): the gate priced the next trial at
    the winner's 5.0 min and launched nothing more with 443 s left and 264 s
    reserved.  A config below the incumbent costs a start and one probe, and
    one above it stops at the deadline, so the gate prices the loser."""
    from qtune.search.budget import trial_budget

    st = _study([(498, 224, 60), (296, 98, 60)])
    c = costs(st)
    assert c.capacity and c.next_s == c.start_s + c.run_s == 98 + 40
    cfg = TuneConfig(time_budget=1200)
    reserve = plan_confirmation(cfg, st, "maximize", with_contenders(1))
    assert reserve.seconds == 2 * (98 + 2 * 40) + 2 * 40
    started = time.monotonic() - 600
    assert over_budget(cfg, st, started, reserve) is None  # 138 + 436 <= 600
    budget = trial_budget(cfg, started, reserve)
    assert budget is not None and budget.confirmed_later
    assert abs(budget.deadline - (started + 1200 - reserve.seconds)) < 1e-6
    assert trial_budget(TuneConfig(), started, reserve) is None
    # with the confirmation off, a trial re-measures its own answer
    off = plan_confirmation(TuneConfig(time_budget=1200, confirm=Confirmation(top=0)), st,
                            "maximize",
                            with_contenders(1))
    budget_off = trial_budget(cfg, started, off)
    assert budget_off is not None and not budget_off.confirmed_later
    # the gate closes once a loser no longer fits
    assert "a start and one probe" in over_budget(cfg, st, time.monotonic() - 800, reserve)


def test_the_gate_prices_a_loser_at_its_floor_probe():
    """A config below the incumbent stops its floor probe as soon as the
    failure is certain (run 13 on one H200: 16-22 s against a median probe
    of 33 s): the gate prices the next launch at a start and the longest
    floor probe seen, not a whole window."""
    st = _study([(480, 200, 60), (130, 70, 58)])
    for total, start, first in ((110, 90, 18.0), (115, 94, 22.0)):
        # as the study keeps a loser: pruned, its one probe apart
        st.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED,
                                               user_attrs={
            Attr.STATUS: "pruned", Attr.REASON: "below_incumbent", Attr.TOTAL_S: total,
            Attr.STARTUP_S: start,
            Attr.PARTIAL_SUMMARY: {"capacity": {"found": False, "below": 20.0,
                                                "floor": 20.0,
                                                "steps": [{"elapsed_s": first,
                                                           "load": 20.0}]}}}))
    c = costs(st)
    assert c.floor_probe_s == 22.0 and c.run_s == 40.0
    assert c.next_s == c.start_s + 22.0
    # the confirmation still pays whole windows: a loser's probe is no price
    assert c.confirm_run_s == c.start_s + 2 * 40.0
    # run 15 on one H200: three losers (starts 89-97 s, probes 15-27 s)
    # after a cold defaults' trial were priced 2.2 min with a 37 s window
    # probe; at a start and the longest floor probe they are 2.0 min


def test_a_tie_is_not_confirmed_and_the_defaults_alone_reserve_one_start():
    """A capacity trial that only held the best so far (a tie: the defaults
    win it) is left out of the confirmation and of its reserve, so the gate
    keeps one config's fresh start, not two, while nothing beat the
    defaults: on run 15's H200 figures that is the price of a sixth launch.
    A trial's own search still leaves time for it to join (``trying``)."""
    from types import SimpleNamespace

    from qtune.search.confirm import candidates, confirmation_plan
    from qtune.search.records import TrialRecord, TrialStatus

    def rec(n: int, value: float, baseline: bool = False) -> TrialRecord:
        return TrialRecord(n, {}, TrialStatus.OK, baseline=baseline, value=value,
                           feasible=True)

    defaults, tie, winner = rec(0, 26.4, True), rec(1, 26.4), rec(2, 30.0)
    capacity = SimpleNamespace(cfg=TuneConfig(objective="capacity"), engines=None)
    assert candidates(capacity, [defaults, tie], 3) == [defaults]
    assert candidates(capacity, [defaults, tie, winner], 3) == [winner, defaults]
    # a latency study confirms its best K, whatever the defaults did
    latency = SimpleNamespace(cfg=TuneConfig(objective="throughput"), engines=None)
    assert candidates(latency, [defaults, tie], 3) == [defaults, tie]

    st = _study([(480, 200, 60), (130, 70, 58)])
    # the second trial tied the defaults (value 1.0 each): one config reserved
    prep = SimpleNamespace(cfg=TuneConfig(objective="capacity", time_budget=1200),
                           direction="maximize", engines=None)
    c = costs(st)
    now = confirmation_plan(prep, st)
    assert now.seconds == (c.confirm_run_s + c.fallback_s) * now.repeats
    trying = confirmation_plan(prep, st, trying=True)
    assert trying.seconds == (2 * c.confirm_run_s + c.fallback_s) * trying.repeats
    assert trying.seconds > now.seconds and (trying.top, trying.repeats) == (now.top, now.repeats)


def test_the_gate_says_the_budget_as_given():
    """--time-budget 6.5 was said as "6 min" (GPU run 23)."""
    st = _study([(498, 224, 60), (296, 98, 60)])
    cfg = TuneConfig(time_budget=390)
    reserve = plan_confirmation(cfg, st, "maximize", with_contenders(1))
    why = over_budget(cfg, st, time.monotonic() - 380, reserve)
    assert why is not None and why.startswith("time budget: 6.5 min,")
