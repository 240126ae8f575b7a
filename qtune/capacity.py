"""Capacity: the highest load a server holds under the SLO, found with as
few probes as the answer needs.

A *probe* runs the workload at one load (a request rate, or a number of
streams in a closed loop) over a sustained window, with prompts no earlier
probe sent, and is judged (``judge_load``): held when the SLO is met, no
request failed and the server kept up.  A probe stops as soon as its verdict
is certain to be "failed" (``qtune.metrics.certain_failure``: a failed
request, or enough requests already past an SLO limit that the percentile
breaks it whatever follows), never early as "held".

The search (``find_capacity``) keeps its state in a ``Bracket``: the highest
load held and the lowest that failed above it.  The fast procedure, the
default:

1. with a *floor* (the best capacity so far in a study, the incumbent), the
   first probe runs at the floor, over the incumbent's window.  A config that
   does not hold there cannot win: the search stops after that one probe
   (``CapacityResult.below``).  One that holds is searched upward from it;
2. without a floor, from the start load: up while held, by as much as the
   probe's headroom under the SLO allows (double far below the limits, a
   quarter near them); halve (or, after a clear overload, step to just under
   the rate the server did serve) while not;
3. bisect until the bracket is within the tolerance (10% by default);
4. re-measure only the answer, over twice the window with fresh prompts; a
   failed re-measure falls back to the next lower load that held and
   bisects again.  When the study's confirmation re-measures on a fresh
   start (``CapacityPlan.remeasure`` False), an answer that becomes the
   next trials' floor is still probed once over twice the window and falls
   back without bisecting (``_Search.check``).  A *soft* failure (only a
   keeping-up signal) is measured again before it decides anything.

The *full* procedure is the one before issue 27 (double from the start load,
no floor, no early stop), kept to measure the fast one against
(``benchmarks/capacity_fast_vs_full.py``).

``CapacityPlan(confirm=True)`` is the confirmation's probe: one sustained
probe (twice the window) at a capacity found earlier, on a fresh start, and
when it does not hold, one at the plan's ``fallback`` on the same start; with
``refine``, when that held far below, one more halfway between them.

The parts apart from the procedure: a probe's verdict
(``qtune.capacity_verdict``) and the plan, probe, bracket and result types
(``qtune.capacity_types``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from qtune import seeds
from qtune.bench import BenchConfig, endpoint_header, measure
from qtune.capacity_types import (
    FAST,
    FULL,
    SUSTAINED_WINDOWS,
    Bracket,
    CapacityPlan,
    CapacityResult,
    Probe,
    rate_load,
)
from qtune.capacity_verdict import judge_load
from qtune.errors import InputError
from qtune.metrics import certain_failure, metric_value, slo_bounds
from qtune.seeds import Phase

# What the rest of qtune imports from here (the plan, result and verdict
# live in their own modules; these paths are the ones callers use).
__all__ = [
    "FAST", "FULL", "SUSTAINED_WINDOWS", "WINDOW_SERVICE_TIMES", "CapacityPlan",
    "CapacityResult", "find_capacity", "judge_load", "run_capacity",
]

Progress = Callable[[str], None]

# A probe's arrival window lasts at least this many service times (the E2E
# median of the first probe): long enough for a 10% overload's backlog to
# add a third to what the server holds.
WINDOW_SERVICE_TIMES = 10
# How far above a load that held the next probe goes, by the held probe's
# headroom (its worst SLO percentile over its limit): far below the limits,
# double; closer, half as far again; near them, a quarter.  A config that
# beats the incumbent usually does so by less than half (H200, interactive
# SLO: 28 against 22 req/s), and each step skipped is a probe of 40-55 s
# there; a probe far above the knee stops early, so overshooting costs little.
GROWTH = ((0.5, 2.0), (0.8, 1.5), (float("inf"), 1.25))
NEAR_LIMIT = 0.8
# A probe that served less than this share of its offered rate was clearly
# over the server's throughput: the next one goes just under what it served.
CLEAR_OVERLOAD = 0.8
UNDER_SERVED = 0.9


MeasureFn = Callable[..., dict[str, Any]]


class _Search:
    """One capacity search on one server: the probes and the bracket."""

    def __init__(self, url: str, model: str, cfg: BenchConfig, plan: CapacityPlan,
                 progress: Progress | None, measure_fn: MeasureFn) -> None:
        self.url, self.model, self.cfg, self.plan = url, model, cfg, plan
        self.progress, self.measure = progress, measure_fn
        self.slos = [s for s in cfg.slo if s.metric != "throughput"]
        wl = cfg.workload
        self.by_rate = wl.concurrency is None
        self.unit = "req/s" if self.by_rate else "concurrency"
        self.window = plan.window_s or cfg.capacity_window
        self.window_known = plan.window_s is not None
        self.service_s: float | None = None
        self.b = Bracket()
        self.fast = plan.procedure == FAST

    # -- one probe --------------------------------------------------------

    def requests_for(self, x: float, scale: float) -> int | None:
        wl = self.cfg.workload
        if not self.by_rate:
            return wl.requests
        return max(math.ceil(x * self.window * scale), wl.requests or 0)

    def probe(self, x: float, scale: float = 1.0, again: bool = False) -> bool:
        wl = self.cfg.workload
        n = self.requests_for(x, scale)
        # a probe that re-sent an earlier probe's prompts would find them in
        # the prefix cache: each draws from a seed of its own
        seed = seeds.seed(wl.seed, Phase.PROBE, len(self.b.probes) + 1)
        w = (dataclasses.replace(wl, rate=x, requests=n, duration=None, seed=seed)
             if self.by_rate else dataclasses.replace(wl, concurrency=int(x), seed=seed))
        if self.progress:
            self.progress(f"capacity: trying {'rate' if self.by_rate else 'concurrency'} "
                          f"{x:g}" + (f" ({n} requests)" if self.by_rate else ""))
        # A backlog of many seconds of arrivals cannot recover within the run.
        cap = max(32, int(x * 10)) if self.by_rate else None
        watch = certain_failure(slo_bounds(self.slos), n or 0) if self.fast else None
        # A probe that ended early left its requests on the server: the next
        # one waits until they are done (on 2 CPU cores, without the wait,
        # eleven probes failed in a row after one stopped at an overload).
        prev = self.b.probes[-1] if self.b.probes else None
        after_stop = prev is not None and bool(prev.summary.get("stopped_early"))
        t0 = time.monotonic()
        s = self.measure(self.url, self.model, w, self.cfg, max_inflight=cap,
                         progress=self.progress, watch=watch,
                         wait_idle=after_stop)
        elapsed = time.monotonic() - t0
        ok, why, kind = judge_load(s, self.slos, x if self.by_rate else None)
        done = s["completed"] + s["failed"]
        aborted = bool(s.get("stopped_early")) and s.get("stopped_early") != "saturated"
        saved = 0.0
        if aborted and n:
            # The arrivals it did not send: at a rate, their share of the
            # window; in a closed loop, at the pace it ran.
            unsent = max(n - done, 0)
            saved = unsent / x if self.by_rate else unsent * elapsed / max(done, 1)
        p = Probe(x, ok, why, kind, n or done, elapsed, s, remeasure=scale > 1,
                  aborted=aborted, saved_s=saved)
        if kind == "soft" and not again:
            # Near the knee the system is bistable and the first run after a
            # start is slow: on one H200 the defaults' very first probe read
            # "queue growing" (32.5 -> 43.3) at a load they then served.  A
            # soft failure is measured again, with fresh prompts, and decides
            # only if it repeats.
            p.why += "; measured again"
            p.retried = True
            self.b.probes.append(p)
            return self.probe(x, scale, again=True)
        self.b.probes.append(p)
        if self.by_rate and self.service_s is None:
            e2e = metric_value(s, "e2e_p50")
            if e2e is not None and not aborted:
                self.service_s = e2e / 1000
                if not self.window_known:
                    # The first probe sets how long every later one runs.
                    self.window = max(self.cfg.capacity_window,
                                      WINDOW_SERVICE_TIMES * e2e / 1000)
                    self.window_known = True
        return ok

    # -- the time budget --------------------------------------------------

    def out_of_time(self, scale: float = 1.0) -> bool:
        """Whether a probe of ``scale`` windows would end past the plan's
        deadline (priced as the longest probe so far, or the window)."""
        if self.plan.deadline is None or not self.b.probes:
            return False
        typical = max([p.elapsed_s for p in self.b.probes if not p.remeasure] or [0.0])
        expected = max(typical, self.window if self.by_rate else 0.0) * scale
        return time.monotonic() + expected > self.plan.deadline

    def timed_out(self, lo: float | None, hi: float | None) -> CapacityResult:
        """The result when the deadline stops the search: the highest load
        that held, not re-measured, with the bracket as far as it got."""
        if lo is None:
            return self.result(found=False, bracket=(None, hi),
                               reason="the time budget ran out before a load held"
                               + (f" (last failed {hi:g})" if hi is not None else ""))
        return self.held_once(lo, hi, "stopped by the time budget: not narrowed or "
                              "re-measured (the confirmation measures it again on a "
                              "fresh start)")

    def held_once(self, lo: float, hi: float | None, note: str) -> CapacityResult:
        """The highest load that held, from its one probe (not re-measured)."""
        held = next(p for p in reversed(self.b.probes) if p.held and p.load == lo)
        return self.result(found=True, value=lo, bracket=(lo, hi), at_value=held,
                           decided=f"{lo:g} {self.unit} held once"
                           + (f", {hi:g} did not" if hi is not None else ""),
                           note=note)

    # -- the procedure ----------------------------------------------------

    def used(self, load: float) -> float | None:
        """The share of its SLO limits the last probe that held ``load``
        used (its worst percentile over its limit); None when none held."""
        held = next((p for p in reversed(self.b.probes) if p.held and p.load == load), None)
        if held is None:
            return None
        return max((v / slo.limit for slo in self.slos
                    if (v := metric_value(held.summary, slo.metric)) is not None
                    and slo.limit > 0), default=0.0)

    def up(self, x: float) -> float:
        """The next load above ``x``, which held: by the headroom it showed
        under the SLO (``GROWTH``); the full procedure doubles."""
        factor = 2.0
        if self.fast:
            factor = next(f for bound, f in GROWTH if (self.used(x) or 0.0) <= bound)
        return (rate_load(x * factor) if self.by_rate
                else float(max(x + 1, math.ceil(x * factor))))

    def down(self, x: float) -> float:
        """The next load after a failure with nothing held yet: just under the
        rate the probe served when it was clearly over the server's
        throughput, else half."""
        if not self.by_rate:
            return max(1.0, math.floor(x / 2))
        last = self.b.probes[-1].summary
        served = last.get("request_throughput") or 0.0
        if self.fast and 0 < served < CLEAR_OVERLOAD * x and \
                not last.get("stopped_early"):
            return rate_load(max(x / 4, UNDER_SERVED * served))
        return rate_load(x / 2)

    def narrow_enough(self, lo: float, hi: float) -> bool:
        if self.by_rate:  # (loads have four digits, rate_load: 1.358 / 1.2345 > 1.1)
            return (hi - lo) / lo <= self.plan.tolerance + 1e-3
        return hi - lo <= 1

    def mid(self, lo: float, hi: float) -> float:
        """The next load inside [lo, hi): the middle, or, when lo held close
        to the SLO's limits (``NEAR_LIMIT`` of them), just one tolerance
        above lo: the knee is near, and that probe closes the bracket if it
        fails (the CPU smoke study spent three halvings of [5, 7.5) where
        lo's E2E p99 had used 85% of its limit)."""
        m = (lo + hi) / 2 if self.by_rate else float(math.floor((lo + hi) / 2))
        if self.fast and (self.used(lo) or 0.0) >= NEAR_LIMIT:
            near = lo * (1 + self.plan.tolerance) if self.by_rate else lo + 1
            m = min(m, near)
        return rate_load(m) if self.by_rate else m

    def bisect(self, lo: float, hi: float) -> tuple[float, float]:
        """Narrow [lo, hi) (lo held, hi did not) to the tolerance."""
        for _ in range(self.cfg.capacity_steps):
            if self.narrow_enough(lo, hi) or self.out_of_time():
                break
            m = self.mid(lo, hi)
            if self.probe(m):
                lo = m
            else:
                hi = m
        return lo, hi

    def result(self, **kw: Any) -> CapacityResult:
        r = CapacityResult(unit=self.unit, procedure=self.plan.procedure,
                           tolerance=self.plan.tolerance, probes=self.b.probes,
                           floor=self.plan.floor,
                           window_s=self.window if self.by_rate else None,
                           service_s=self.service_s, **kw)
        if r.found and r.decided and (band := r.noise_band) is not None:
            where = (f"at {band[0]:g} {self.unit}" if band[0] == band[1]
                     else f"between {band[0]:g} and {band[1]:g} {self.unit}")
            r.decided += f"; {where} one probe's verdict went either way"
        return r

    def run(self) -> CapacityResult:
        plan = self.plan
        if plan.confirm:
            return self.confirm()
        floor = plan.floor if self.fast else None
        lo: float | None = None
        hi: float | None = None
        if floor is not None:
            if not self.probe(floor):
                last = self.b.probes[-1]
                of = f" ({plan.floor_of})" if plan.floor_of else ""
                return self.result(
                    found=False, below=floor,
                    reason=f"did not hold {floor:g} {self.unit}, the best so far{of}: "
                    f"{last.why}; it cannot win, so one probe decided")
            lo = floor
            x = self.up(floor)
        else:
            x = plan.start if self.by_rate else float(max(1, int(plan.start)))
        # Bracket: up while the SLO holds, down while it does not.
        for _ in range(12):
            if self.out_of_time():
                return self.timed_out(lo, hi)
            if self.probe(x):
                lo = x
                if hi is not None:
                    break
                x = self.up(x)
            else:
                hi = x
                if lo is not None:
                    break
                x = self.down(x)
                if (self.by_rate and x < 0.01) or (not self.by_rate and hi == 1):
                    break
        if lo is None:
            return self.result(found=False, reason=f"SLO not met even at {hi:g}")
        if hi is None:
            return self.result(found=True, value=lo, bracket=(lo, None),
                               note="SLO still met at the highest load tried",
                               decided=f"held at every load tried, up to {lo:g} {self.unit}")
        lo, hi = self.bisect(lo, hi)
        if not plan.remeasure:
            if not self.narrow_enough(lo, hi) and self.out_of_time():
                return self.timed_out(lo, hi)
            return self.check(lo, hi)
        if self.out_of_time(scale=SUSTAINED_WINDOWS):
            return self.timed_out(lo, hi)
        return self.remeasure(lo, hi)

    def check(self, lo: float, hi: float) -> CapacityResult:
        """Without the in-trial re-measure (the confirmation re-measures on a
        fresh start), an answer that would become the next trials' floor (the
        first search's, or one above the floor) still gets one probe over
        twice the window; when it fails, the answer is the highest load held
        below it, once, and nothing is bisected again.  A floor that held one
        window by luck cuts every later config at a load its own incumbent
        cannot hold: on one H100 (run 22) the defaults held 26.4 req/s once,
        all six later configs failed it in one probe each, and the defaults
        then failed 26.4 and 24 on their fresh start, as vLLM's own client
        failed 26.4 (TPOT p99 26.0 ms against 20).  An answer that only ties
        the floor cannot win, so it is not checked."""
        floor = self.plan.floor if self.fast else None
        note = "not re-measured in the trial: the confirmation measures it again on a fresh start"
        if (floor is not None and lo <= floor) or self.out_of_time(scale=SUSTAINED_WINDOWS):
            return self.held_once(lo, hi, note)
        if self.probe(lo, scale=SUSTAINED_WINDOWS):
            last = self.b.probes[-1]
            return self.result(found=True, value=lo, bracket=(lo, hi), at_value=last,
                               decided=f"{lo:g} {self.unit} held once and over a re-measure "
                               f"of {last.requests} requests (fresh prompts); {hi:g} did not",
                               note="the confirmation measures it again on a fresh start")
        why = self.b.probes[-1].why
        # (with a floor, the floor held the first probe and lo is above it,
        # so what held below lo is the floor at least: a tie at worst)
        below = self.b.held_below(lo)
        if below is None:
            return self.result(found=False, bracket=(None, lo),
                               reason=f"held {lo:g} {self.unit} once but not on its "
                               f"re-measure ({why}), and no lower load was measured")
        return self.held_once(below, lo, f"{lo:g} {self.unit} held once but not on its "
                              f"re-measure ({why}); {note}")

    def remeasure(self, lo: float, hi: float) -> CapacityResult:
        """Re-measure the answer over twice the window, with fresh prompts: a
        load that only passed once by luck is no capacity.  When it fails, it
        is the new upper end: fall back to the next lower load that passed
        earlier (a 5% step is smaller than a short run's noise near the knee,
        so it can fail three times in a row), else a fifth lower (or one
        stream), and bisect that bracket again.  Without the bisection a lucky
        first probe cost the resolution: on one H200, SGLang's defaults passed
        30 req/s once, failed its re-measure, and the answer fell back to the
        last pass below, 20, with a bracket [20, 30) five times the
        tolerance."""
        last: Probe | None = None
        for attempt in range(5):
            if attempt and self.out_of_time(scale=SUSTAINED_WINDOWS):
                return self.timed_out(self.b.held_below(hi), hi)
            if self.probe(lo, scale=SUSTAINED_WINDOWS):
                last = self.b.probes[-1]
                break
            hi = lo
            floor = self.plan.floor if self.fast else None
            if floor is not None and hi <= floor:
                # It held the incumbent's capacity once, not on the re-measure:
                # it cannot win, and searching below the floor only prices a
                # loser (on 2 busy cores one such search took 19 probes).
                of = f" ({self.plan.floor_of})" if self.plan.floor_of else ""
                return self.result(
                    found=False, below=floor,
                    reason=f"held {floor:g} {self.unit}, the best so far{of}, once but "
                    f"not on its re-measure: {self.b.probes[-1].why}; it cannot win")
            below = self.b.held_below(lo)
            lo = below if below is not None else (lo * 0.8 if self.by_rate
                                                  else max(1.0, lo - 1))
            lo, hi = self.bisect(lo, hi)
        if last is None:
            return self.result(found=False, bracket=(None, hi),
                               reason="no load held the SLO when re-measured "
                               f"(last tried {hi:g})")
        failed = self.b.failed_at(hi)
        why_not = failed.why if failed else "did not hold"
        window = (f" ({last.summary['keeps_up']['window_s']:.0f} s of arrivals, fresh prompts)"
                  if (last.summary.get("keeps_up") or {}).get("window_s")
                  else " (fresh prompts)")
        decided = (f"{lo:g} {self.unit} held over a re-measure of {last.requests} requests"
                   f"{window}; {hi:g} did not ({why_not})")
        return self.result(found=True, value=lo, bracket=(lo, hi), at_value=last,
                           decided=decided)

    def confirm(self) -> CapacityResult:
        """One sustained probe at a capacity found before, on a fresh start,
        over twice the window (``SUSTAINED_WINDOWS``) with fresh prompts: held
        or not, nothing searched.  A fresh start is an independent run, but
        one window is not long enough near the knee: on one H200 (run 16) the
        defaults held 26.4 req/s over one window on their fresh start, and
        vLLM's own client broke the SLO there over two."""
        x = self.plan.floor
        assert x is not None  # CapacityPlan checks it
        held = self.probe(x, scale=SUSTAINED_WINDOWS)
        last = self.b.probes[-1]
        if held:
            return self.result(found=True, value=x, at_value=last, bracket=(x, None),
                               decided=f"{x:g} {self.unit} held on a fresh start "
                               f"({last.requests} requests)")
        failed = f"{x:g} {self.unit} did not hold on a fresh start: {last.why}"
        fb = self.plan.fallback
        if fb is not None and self.probe(fb, scale=SUSTAINED_WINDOWS):
            at = self.b.probes[-1]
            decided = f"{failed}; {fb:g} {self.unit} held ({at.requests} requests)"
            m = self.middle(fb, x)
            if m is None:
                return self.result(found=True, value=fb, at_value=at, bracket=(fb, x),
                                   decided=decided)
            if self.probe(m, scale=SUSTAINED_WINDOWS):
                at = self.b.probes[-1]
                return self.result(found=True, value=m, at_value=at, bracket=(m, x),
                                   decided=f"{decided}; so did {m:g} between them "
                                   f"({at.requests} requests)")
            return self.result(found=True, value=fb, at_value=at, bracket=(fb, m),
                               decided=f"{decided}; {m:g} between them did not: "
                               f"{self.b.probes[-1].why}")
        if fb is not None:
            failed += f"; nor did {fb:g}: {self.b.probes[-1].why}"
        return self.result(found=False, below=x, reason=failed)

    def middle(self, held: float, failed: float) -> float | None:
        """``CapacityPlan.refine``: the load halfway between a fallback that
        held and the load that failed, when more than two tolerances apart
        and the deadline leaves twice the longest probe of this start (a soft
        failure is measured again); four digits (``rate_load``)."""
        longest = max((p.elapsed_s for p in self.b.probes), default=0.0)
        if not self.plan.refine or (self.plan.deadline is not None and
                                    time.monotonic() + 2 * longest > self.plan.deadline):
            return None
        if self.by_rate:
            wide = (failed - held) / held > 2 * self.plan.tolerance + 1e-9
            return rate_load((held + failed) / 2) if wide else None
        return float((held + failed) // 2) if failed - held > 2 else None


def find_capacity(url: str, model: str, cfg: BenchConfig,
                  progress: Progress | None = None, plan: CapacityPlan | None = None,
                  *, measure_fn: MeasureFn = measure) -> CapacityResult:
    """The highest load that holds the SLO *and* that the server keeps up
    with, re-measured over a window twice as long with fresh prompts (see the
    module's docstring for the procedure).

    Rate mode: each probe's arrival window is at least ``cfg.capacity_window``
    seconds and 10 service times (the E2E median of the first probe), never
    fewer requests than the workload's own count; with a floor, the window
    given in the plan (the incumbent's).  Concurrency mode is a closed loop
    (no backlog can build): the workload's count is used."""
    slos = [s for s in cfg.slo if s.metric != "throughput"]
    if not slos:
        raise InputError("--find-capacity needs a latency SLO",
                         hint="e.g. --slo 'ttft_p99<=500ms,tpot_p99<=50ms'")
    wl = cfg.workload
    if plan is None:
        start = wl.rate if wl.concurrency is None else float(wl.concurrency or 1)
        assert start is not None  # a workload has a rate or a concurrency
        plan = CapacityPlan(start=start, tolerance=cfg.capacity_tolerance)
    return _Search(url, model, cfg, plan, progress, measure_fn).run()


def run_capacity(cfg: BenchConfig, progress: Callable[[str], None] | None = None
                 ) -> dict[str, Any]:
    """``qtune bench --find-capacity``: the endpoint's header, then the
    capacity search on the first endpoint."""
    out, models = endpoint_header(cfg)
    out["capacity"] = find_capacity(cfg.urls[0], models[0], cfg, progress).to_dict()
    return out
