"""The time budget (``--time-budget``): what a trial and the confirmation
cost on this host, as the study measured them, and when the search must
stop launching new configs so that the confirmation still fits.

The confirmation is part of the plan from the first measured trial on: its
cost (fresh starts of the top configs and the engine defaults, each measured
once) is reserved, and the search stops launching early enough to pay it.
Without flags that fix its size, it is sized to the budget: the top configs
and the repeats shrink (to the best config and the defaults, one fresh start
each) until it fits in ``CONFIRM_SHARE`` of the budget.  Issue 27: on one
H200 a 22-minute capacity study spent the whole budget on 3 launches and
ended "confirmation skipped".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from qtune.capacity import SUSTAINED_WINDOWS
from qtune.search.config import TuneConfig
from qtune.search.records import BELOW, Attr, TrialStatus

# The share of the budget the confirmation may take when qtune sizes it, while
# leaving most of the budget to the search.  The smallest confirmation (the
# best config and the defaults, one fresh start each) is kept even above it:
# on one H200 (run 16's starts of ~100 s and probes of ~37 s, each confirmation
# probe two windows) it costs ~7 min of a 20-minute budget, the share 6.
CONFIRM_SHARE = 0.3
FIRST_START_SHARE = 0.5


@dataclass(frozen=True)
class Costs:
    """What the study measured so far: the median start, the median
    measurement a confirmation run repeats, a typical trial's wall time,
    and the price of the next launch (``next_s``)."""

    start_s: float
    run_s: float
    trial_s: float
    # A capacity study with a floor: a start and one probe, what a config
    # below the incumbent costs (a trial that holds the floor is searched
    # until the deadline, ``trial_budget``, so it cannot overrun).
    capacity: bool = False
    # The longest floor probe of the trials with a floor (None before one):
    # what a loser's one probe costs.  It stops as soon as its failure is
    # certain, so it is shorter than a whole window: on one H200 (runs 13
    # and 15) 15-27 s against a median probe of 33-37 s.  The longest, not
    # the median: a config that holds the floor runs its whole window before
    # the deadline can stop it, and that probe is priced once one is seen.
    floor_probe_s: float | None = None

    @property
    def next_s(self) -> float:
        """What the launch gate prices the next trial at: for a capacity
        study, a start and one floor probe."""
        if not self.capacity:
            return self.trial_s
        return self.start_s + (self.floor_probe_s if self.floor_probe_s is not None
                               else self.run_s)

    @property
    def confirm_run_s(self) -> float:
        """One confirmation run: a fresh start and one measurement (for a
        capacity, one probe over ``SUSTAINED_WINDOWS``)."""
        return self.start_s + self.confirm_probe_s

    @property
    def confirm_probe_s(self) -> float:
        """A confirmation's one measurement: a capacity's is a probe over
        ``SUSTAINED_WINDOWS`` windows, priced at that many typical probes."""
        return SUSTAINED_WINDOWS * self.run_s if self.capacity else self.run_s

    @property
    def fallback_s(self) -> float:
        """What a capacity confirmation adds for one fallback rung (a config
        that does not hold its capacity on its fresh start is probed once
        more there, one rung lower: ``CapacityPlan.fallback``).  One rung a
        repeat is the confirmation of a real gain: the defaults, challenged
        at the winner's load on each fresh start, fail it and fall back to
        their own capacity.  A middle rung above a fallback that held far
        below (``CapacityPlan.refine``) is not priced: it runs only in the
        confirmation's last run, when each config has one fresh start and it
        ends before the budget does (``qtune.search.fresh.remeasure``)."""
        return self.confirm_probe_s if self.capacity else 0.0


@dataclass(frozen=True)
class ConfirmationPlan:
    """How many of the best configs are re-measured and how often (the
    engine defaults are re-measured with them), and what that costs."""

    top: int
    repeats: int
    seconds: float
    why: str = ""

    @property
    def off(self) -> bool:
        return self.repeats <= 0


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def costs(study: optuna.Study) -> Costs:
    """The study's measured costs.  A typical trial is the median of the
    trials after the engine defaults; before there are any, a start and a
    measurement (for a capacity study, a start and two probes: the floor
    and one more, since the defaults' whole search is no later trial's
    cost).  The first start is left out of the median start when there are
    others: it paid the cold compile that later ones do not."""
    trials = study.get_trials(deepcopy=False)
    totals = [a[Attr.TOTAL_S] for t in trials
              if (a := t.user_attrs).get(Attr.TOTAL_S) and not a.get(Attr.BASELINE)]
    starts = [a[Attr.STARTUP_S] for t in trials if (a := t.user_attrs).get(Attr.STARTUP_S)]
    runs, probes, floor_probes = [], [], []
    for t in trials:
        a = t.user_attrs
        # a config below the incumbent is pruned, its one probe kept apart
        below = a.get(Attr.STATUS) == TrialStatus.PRUNED and a.get(Attr.REASON) == BELOW
        if (a.get(Attr.STATUS) != TrialStatus.OK and not below) or Attr.SERVER_OF in a:
            continue
        cap = (a.get(Attr.PARTIAL_SUMMARY if below else Attr.SUMMARY) or {}).get(
            "capacity") or {}
        steps = cap.get("steps") or []
        first = steps[0] if steps else {}
        # (the full procedure has a floor it never probes)
        if cap.get("floor") is not None and first.get("load") == cap["floor"] \
                and first.get("elapsed_s") and not first.get("remeasure"):
            floor_probes.append(float(first["elapsed_s"]))
        if below:
            continue  # stopped early: no price for a confirmation's whole window
        probes += [float(st["elapsed_s"]) for st in steps
                   if st.get("elapsed_s") and not st.get("remeasure")]
        if not cap and a.get(Attr.MEASURE_S):
            runs.append(float(a[Attr.MEASURE_S]))
    if len(starts) > 1:
        start = _median(starts[1:])
    else:
        # Only the first start is known, and it paid one-time costs (the
        # compile, kernel JIT and autotuning that caches keep for later
        # starts): on one H200 first starts took 165-247 s and later ones
        # 60-120 s.  Half of it, but not less than a minute, until a second
        # start is measured.
        start = min(_median(starts), max(60.0, FIRST_START_SHARE * _median(starts)))
    # a capacity's typical probe: its confirmation runs SUSTAINED_WINDOWS of them
    run = _median(probes) if probes else _median(runs)
    trial = _median(totals) if totals else \
        start + (2 * _median(probes) if probes else run)
    return Costs(start_s=start, run_s=run, trial_s=trial, capacity=bool(probes),
                 floor_probe_s=max(floor_probes) if floor_probes else None)


def plan_confirmation(cfg: TuneConfig, study: optuna.Study, direction: str,
                      size: Callable[[int], tuple[int, int]], *,
                      trying: bool = False) -> ConfirmationPlan:
    """The confirmation this study will run: its flags', or with a time
    budget and no flags that fix it, the largest that fits in
    ``CONFIRM_SHARE`` of the budget (at least the best config and the
    defaults, once each).  ``size(k)``: how many configs a confirmation of
    the best ``k`` re-measures, the engine defaults included, now and if the
    next trial joined it.  It is sized for the next trial joining it (so a
    winner found late is confirmed as planned); its seconds are for the
    configs it holds now, or with the next one when ``trying``."""
    if cfg.confirm.top <= 0 or cfg.confirm.repeats <= 0 or cfg.pick is not None \
            or direction == "pareto":
        return ConfirmationPlan(0, 0, 0.0, "off")
    c = costs(study)

    def seconds(n: int, r: int) -> float:
        # every config on r fresh starts, and the defaults' one fallback rung
        # on each (challenged at a winner's load, or failing their own)
        return (n * c.confirm_run_s + c.fallback_s) * r if n else 0.0

    def plan(k: int, r: int, why: str = "") -> ConfirmationPlan:
        now, joined = size(k)
        return ConfirmationPlan(k, r, seconds(joined if trying else now, r), why)

    top = cfg.confirm.top
    if cfg.time_budget is None or cfg.confirm.fixed:
        return plan(top, cfg.confirm.repeats)
    share = CONFIRM_SHARE * cfg.time_budget
    for k, r in ((top, cfg.confirm.repeats), (1, cfg.confirm.repeats), (1, 1)):
        k = min(k, top)
        if seconds(size(k)[1], r) <= share or (k, r) == (1, 1):
            if (k, r) != (top, cfg.confirm.repeats):
                joined = seconds(size(k)[1], r)
                return plan(k, r, f"sized to the time budget: the best {k} and the engine "
                            f"defaults, {r} fresh start{'s' if r > 1 else ''} each "
                            f"(~{joined / 60:.1f} min at most)")
            return plan(k, r)
    raise AssertionError("unreachable: the last plan is always taken")


def study_end(cfg: TuneConfig, started: float) -> float | None:
    """When the study must be done (``time.monotonic()``): its start plus
    ``--time-budget``; None without one.  Every part of a study that plans
    by the budget (the launch gate, a trial's deadline, the confirmation's
    middle rung, the speculative phase) reads its end here."""
    return None if cfg.time_budget is None else started + cfg.time_budget


def over_budget(cfg: TuneConfig, study: optuna.Study, started: float,
                reserve: ConfirmationPlan) -> str | None:
    """Why a new trial must not start (None: it may): a typical trial and
    the confirmation's reserve no longer fit in the budget."""
    if (end := study_end(cfg, started)) is None:
        return None
    c = costs(study)
    left = end - time.monotonic()
    if c.next_s + reserve.seconds <= left:
        return None
    why = (f"time budget: {(end - started) / 60:.3g} min, a trial takes "
           f"~{c.next_s / 60:.1f} min" + (" (a start and one probe)" if c.capacity else ""))
    if reserve.seconds:
        why += f", and {reserve.seconds / 60:.1f} min are kept for the confirmation"
    return why


@dataclass(frozen=True)
class TrialBudget:
    """What a trial's capacity search may spend under ``--time-budget``:
    ``deadline`` (``time.monotonic()``), the budget less the confirmation's
    reserve, by which it must end; ``confirmed_later``: the confirmation
    re-measures the top configs on fresh starts, so a trial does not
    re-measure its own answer (``CapacityPlan.remeasure``)."""

    deadline: float
    confirmed_later: bool


def trial_budget(cfg: TuneConfig, started: float,
                 reserve: ConfirmationPlan) -> TrialBudget | None:
    """A trial's budget (None: no ``--time-budget``)."""
    if (end := study_end(cfg, started)) is None:
        return None
    return TrialBudget(end - reserve.seconds, not reserve.off)
