"""What a capacity search runs by, keeps and returns: its plan
(``CapacityPlan``), each probe (``Probe``), its state (``Bracket``) and its
answer (``CapacityResult``).

These are data with no probing in them: the study builds plans and reads
results (``qtune.search``), and the report and ``--json`` read a result's
dictionary (``CapacityResult.to_dict``).  The procedure that fills them,
``qtune.capacity``, is apart so that each reads on its own (issue 30).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qtune.bench import KEY_METRICS
from qtune.metrics import metric_value
from qtune.options import DEFAULT_TOLERANCE
from qtune.stats import VerdictCapacity, capacity_from_verdicts

# A load is an answer only once it held over this many windows: the answer's
# re-measure in a trial and the confirmation's probe on a fresh start.  Near
# the knee one window passes by luck: on one H200 (runs 15 and 16) the
# defaults held 26.4 req/s over one window in their search and again on a
# fresh start, and vLLM's own client broke the SLO there over twice the
# window (TPOT p99 20.9 ms, then 30.7 ms, against 20; 160-187 requests in
# flight against 122-142 in the one-window probes).
SUSTAINED_WINDOWS = 2.0
# The procedures (``CapacityPlan.procedure``; ``qtune.capacity`` says how each runs).
FAST, FULL = "fast", "full"


def rate_load(x: float) -> float:
    """A rate a capacity search asks for, to four significant digits: steps
    of 1.1x asked for 1.2100000000000002 req/s in a CPU search's JSON."""
    return float(f"{x:.4g}")


@dataclass(frozen=True)
class CapacityPlan:
    """How one capacity search runs.

    ``start``: the first load without a floor (the workload's rate or stream
    count).  ``floor``: the incumbent's capacity, probed first over
    ``window_s`` (its window), so that a config that cannot beat it costs one
    probe.  ``confirm``: probe ``floor`` once over ``SUSTAINED_WINDOWS`` and stop
    (the confirmation of a capacity found earlier, on a fresh start)."""

    start: float
    floor: float | None = None
    window_s: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    procedure: str = FAST
    confirm: bool = False
    # The study's name for the floor, for the result's words ("trial 3").
    floor_of: str | None = None
    # time.monotonic() by which the search must end (--time-budget less the
    # confirmation's reserve): after the first probe, no probe starts that
    # would end past it; the search then keeps the highest load that held,
    # with its bracket, unre-measured (the confirmation measures it again on
    # a fresh start).  On one H200 the launch gate priced a later trial at a
    # winner's 5.0 min and launched nothing more, where a losing trial costs
    # a start and one probe (98 + 33 s): with a deadline a winner cannot
    # overrun, so the gate prices the loser.
    deadline: float | None = None
    # False: the answer is not re-measured in the trial, because the study's
    # confirmation measures it again on a fresh start (``--time-budget``
    # plans one from the first trial on).  The in-trial re-measure over twice
    # the window was the costliest probe of a trial, and near the knee its
    # failure restarted the bisection: on one H200 the defaults' search took
    # 7 probes (274 s), 3 of them re-measures, where 4 bracketed the answer
    # to the tolerance.  A fresh start is the stronger check of a lucky pass.
    # An answer that becomes the next trials' floor still gets one probe over
    # twice the window, with no bisection after it (``_Search.check``).
    remeasure: bool = True
    # A confirmation's second rung: the load probed on the same fresh start
    # when ``floor`` does not hold (the next lower load the config held in
    # its search, or a challenged config's own capacity).  Without the
    # in-trial re-measure a capacity may have held once by luck: on one H200
    # the winner's 27.5 req/s (TPOT p99 19.8 ms against 20) failed on its
    # fresh start and under vLLM's own client (23.4 ms), which left the study
    # with no confirmed gain, where 25 req/s had held in its search.
    fallback: float | None = None
    # A confirmation whose fallback held and lies more than two tolerances
    # below the load that failed probes once more, between the two, when
    # ``deadline`` leaves time for it (``_Search.confirm``).  On one H100
    # (run 24) the defaults failed 24 req/s on their fresh start and held the
    # fallback, 16, the highest load held below 24 in their search; vLLM's
    # own client read TPOT p99 15.9 ms at 16 and 23.8 ms at 24 (limit 20), so
    # the profile planned with about a fifth less than the host holds.  Off
    # for a challenge (its fallback is the config's own capacity); under
    # --time-budget only where the budget leaves room (``remeasure``).
    refine: bool = False

    def __post_init__(self) -> None:
        if self.procedure not in (FAST, FULL):
            raise ValueError(f"unknown capacity procedure {self.procedure!r}")
        if self.confirm and self.floor is None:
            raise ValueError("a confirmation probes a capacity found before: give floor")
        if self.refine and (not self.confirm or self.fallback is None):
            raise ValueError("a middle rung refines a confirmation's fallback: give fallback")
        if self.fallback is not None and (not self.confirm or self.floor is None
                                          or not 0 < self.fallback < self.floor):
            raise ValueError("a fallback is a confirmation's lower load: below floor")


@dataclass
class Probe:
    """One probe: the load, its verdict and what it measured."""

    load: float
    held: bool
    why: str
    kind: str  # ok | hard | soft
    requests: int
    elapsed_s: float  # wall time of the probe: warm-up, window and drain
    summary: dict[str, Any] = field(repr=False)
    # over SUSTAINED_WINDOWS: the answer's re-measure, or a confirmation's probe
    remeasure: bool = False
    aborted: bool = False  # stopped once its failure was certain
    saved_s: float = 0.0  # arrival time it did not need to spend, when aborted
    retried: bool = False  # a soft failure measured again: the re-run decided

    def to_dict(self) -> dict[str, Any]:
        """The probe as a capacity result lists it (its ``steps``)."""
        s = self.summary
        k = s.get("keeps_up") or {}
        out: dict[str, Any] = {
            "load": self.load, "ok": self.held, "why": self.why,
            "requests": s["completed"] + s["failed"], "planned": self.requests,
            "elapsed_s": round(self.elapsed_s, 3),
            "window_s": k.get("window_s"), "served_share": k.get("served_share"),
            "held_growth": k.get("held_growth"),
            "held_growth_per_send": k.get("held_growth_per_send"),
            "prefix_cache_hit_rate": (s.get("server") or {}).get("prefix_cache_hit_rate"),
            # how late the client's own loop ran (qtune.load.LoopLag)
            "client_lag_max_ms": (s.get("client_lag_ms") or {}).get("max"),
        }
        if s.get("failed"):
            # What the failed requests said (the summary's first 80 characters
            # of each error, counted): on the CPU target 16 of 77 probes were
            # decided by connection errors the server never logged, which a
            # verdict alone could not tell from an engine's failure.
            out["failed"] = s["failed"]
            out["errors"] = dict(s.get("errors") or {})
        if self.remeasure:
            out["remeasure"] = True
        if self.retried:
            out["retried"] = True
        if self.aborted:
            out["aborted"] = True
            out["saved_s"] = round(self.saved_s, 3)
        out.update({key: s[key] for key in ("length_mismatch", "prompt_length",
                                            "usage_distrusted", "idle_wait_s", "resent")
                    if s.get(key) is not None})
        out.update({m: metric_value(s, m) for m in KEY_METRICS})
        return out


def step_verdicts(steps: list[Any]) -> list[tuple[float, bool]]:
    """(load, held) of each step of a stored capacity record
    (``CapacityResult.to_dict``'s ``steps``, read back from a study or a
    benchmark's JSON) that decided: a soft failure measured again counts as
    its re-run, as in ``CapacityResult.from_verdicts``."""
    return [(float(st["load"]), bool(st.get("ok"))) for st in steps
            if isinstance(st, dict) and not st.get("retried")]


@dataclass
class Bracket:
    """The state of a capacity search (vLLM's ``SLAHistory`` plays this part
    in ``vllm bench sweep serve_sla``): every probe in order, the highest load
    held (``lo``) and the lowest load that failed above it (``hi``).  Near the
    knee one short run passes or fails by luck, so the ends are set by the
    search's steps, not recomputed from every probe."""

    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None
    hi: float | None = None

    def width(self) -> float | None:
        """(hi - lo) / lo, once both ends are known."""
        if self.lo is None or self.hi is None or self.lo <= 0:
            return None
        return (self.hi - self.lo) / self.lo

    def held_below(self, load: float) -> float | None:
        """The highest load below ``load`` that held a probe."""
        passed = [p.load for p in self.probes if p.held and p.load < load]
        return max(passed) if passed else None

    def failed_at(self, load: float) -> Probe | None:
        """The last probe at ``load`` that failed."""
        return next((p for p in reversed(self.probes) if not p.held and p.load == load), None)


@dataclass
class CapacityResult:
    """What a capacity search found.  ``found``: a load held on the
    re-measure (``value``, with ``bracket`` [held, failed)); ``below``: the
    search stopped after its first probe, at the floor, which did not hold."""

    found: bool
    unit: str
    procedure: str
    tolerance: float
    probes: list[Probe]
    value: float | None = None
    bracket: tuple[float | None, float | None] | None = None
    at_value: Probe | None = None
    decided: str | None = None
    reason: str | None = None  # why nothing was found
    note: str | None = None
    below: float | None = None  # the floor it did not hold
    floor: float | None = None
    window_s: float | None = None  # each probe's arrival window (rate mode)
    service_s: float | None = None  # the first probe's E2E median

    @property
    def saved_s(self) -> float:
        """Arrival time the probes stopped early did not spend."""
        return sum(p.saved_s for p in self.probes)

    @property
    def probes_s(self) -> float:
        return sum(p.elapsed_s for p in self.probes)

    @property
    def noise_band(self) -> tuple[float, float] | None:
        """(lowest load that failed, highest load that held) when the first is
        not above the second: the loads where one probe's verdict went either
        way (one load that held and then failed its re-measure is a band of
        one load).  Within one window the bisection never fails below a load
        that held, so a band pairs probes of the window and of the re-measure
        over twice it.
        Near the knee a short window decides by luck: on one H200 the TPOT
        p99 of one config at 24 req/s read 14.9, 19.4 and 20.5 ms against a
        20 ms limit, and on 2 CPU cores 3 and 4 req/s each held 2 of 5
        probes (benchmarks/results/verdict-noise-20261203).  A
        bracket finer than this band is finer than the measurement."""
        held = [p.load for p in self.probes if p.held]
        failed = [p.load for p in self.probes if not p.held and not p.retried]
        if not held or not failed or min(failed) > max(held):
            return None
        return min(failed), max(held)

    @property
    def from_verdicts(self) -> VerdictCapacity | None:
        """The capacity read from every probe's verdict as a noisy one, with
        its 90% interval (qtune.stats.capacity_from_verdicts); a soft failure
        measured again counts as its re-run."""
        return capacity_from_verdicts([(p.load, p.held) for p in self.probes
                                       if not p.retried])

    def summary_at_value(self) -> dict[str, Any] | None:
        """The whole summary of the run that decided: the re-measure at the
        capacity, or the floor's probe of a config below it."""
        if self.at_value is not None:
            return self.at_value.summary
        if self.below is not None and self.probes:
            return self.probes[-1].summary
        return None

    def to_dict(self) -> dict[str, Any]:
        """As stored in a trial's summary and printed by ``--json``."""
        out: dict[str, Any] = {"found": self.found, "unit": self.unit,
                               "procedure": self.procedure, "tolerance": self.tolerance}
        if self.value is not None:
            out["value"] = self.value
        if self.bracket is not None:
            out["bracket"] = list(self.bracket)
        if self.at_value is not None:
            out["at_value"] = self.at_value.to_dict()
        for key in ("decided", "reason", "note", "below", "floor"):
            if (v := getattr(self, key)) is not None:
                out[key] = v
        if (band := self.noise_band) is not None:
            out["noise_band"] = {"lowest_failed": band[0], "highest_held": band[1]}
        if (v := self.from_verdicts) is not None:
            out["from_verdicts"] = v.to_dict()
        out["steps"] = [p.to_dict() for p in self.probes]
        out["probes"] = len(self.probes)
        out["probes_s"] = round(self.probes_s, 3)
        out["saved_s"] = round(self.saved_s, 3)
        out["window_s"] = self.window_s
        out["service_s"] = self.service_s
        out["remeasure_window_s"] = (SUSTAINED_WINDOWS * self.window_s if self.window_s
                                     else None)
        return out
