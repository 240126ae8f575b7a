"""Early stop of a trial's measurement (pruning)."""

from __future__ import annotations

from typing import Any

from qtune.metrics import percentile_exceeds_for_sure
from qtune.objectives import get_objective
from qtune.search.config import TuneConfig


def make_pruner(cfg: TuneConfig, best_value: float | None) -> Any:
    """Stop a measurement as soon as the trial cannot win: its objective
    percentile will exceed the best so far by more than ``prune_margin``, an
    SLO percentile its limit, or a request failed (infeasible).  The
    percentile test is exact (``percentile_exceeds_for_sure``), so no trial
    that could still land within the margin is dropped."""
    planned = cfg.workload.requests or 0  # 0: no count planned, no percentile target
    targets: list[tuple[str, float, float, str]] = []
    base, _, pct = cfg.objective.rpartition("_")
    if planned and best_value is not None and get_objective(cfg.objective).prunable:
        margin = cfg.prune_margin
        targets.append((base, float(pct[1:]), best_value * (1 + margin),
                        f"{cfg.objective} cannot beat the best"
                        + (f" ({best_value:.1f}) by less than {margin:.0%}" if margin else "")))
    for slo in cfg.slo:
        b, _, p = slo.metric.rpartition("_")
        if planned and slo.op == "<=" and p.startswith("p") and b in ("ttft", "e2e", "tpot"):
            targets.append((b, float(p[1:]), slo.limit, f"breaks SLO {slo}"))

    def watch(done: list[Any], inflight: list[Any], now: float) -> str | None:
        if (why := _failed(done)) is not None:
            return why
        for b, p, thr_ms, why in targets:
            if b == "ttft":
                vals = [s.ttft for s in done if s.ttft is not None]
                lower = [s.ttft if s.ttft is not None else now - s.start for s in inflight]
            elif b == "e2e":
                vals = [s.e2e for s in done if s.e2e is not None]
                lower = [now - s.start for s in inflight]
            else:
                vals = [t for s in done if (t := s.tpot) is not None]
                lower = []
            if percentile_exceeds_for_sure(vals, lower, planned, p, thr_ms / 1000.0):
                over = sum(1 for v in [*vals, *lower] if v > thr_ms / 1000.0)
                return (f"{why}: {over} of {planned} requests already took longer than "
                        f"{thr_ms:.1f} ms, enough to fix its p{p:g}")
        return None

    return watch if targets else (lambda done, inflight, now: _failed(done))


def _failed(done: list[Any]) -> str | None:
    """The first failed request, with its error: the study must say why."""
    bad = next((s for s in done if not s.ok), None)
    return None if bad is None else f"a request failed ({bad.error})"
