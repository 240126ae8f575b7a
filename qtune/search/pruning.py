"""Early stop of a trial's measurement (pruning)."""

from __future__ import annotations

from qtune.metrics import Bound, Watcher, certain_failure, slo_bounds
from qtune.objectives import get_objective
from qtune.search.config import TuneConfig


def make_pruner(cfg: TuneConfig, best_value: float | None) -> Watcher:
    """Stop a measurement as soon as the trial cannot win: its objective
    percentile will exceed the best so far by more than ``prune_margin``, an
    SLO percentile its limit, or a request failed (infeasible).  The
    percentile test is exact (``qtune.metrics.certain_failure``), so no trial
    that could still land within the margin is dropped."""
    planned = cfg.workload.requests or 0  # 0: no count planned, no percentile target
    bounds: list[Bound] = []
    base, _, pct = cfg.objective.rpartition("_")
    if planned and best_value is not None and get_objective(cfg.objective).prunable:
        margin = cfg.prune_margin
        bounds.append(Bound(base, float(pct[1:]), best_value * (1 + margin),
                            f"{cfg.objective} cannot beat the best"
                            + (f" ({best_value:.1f}) by less than {margin:.0%}"
                               if margin else "")))
    return certain_failure(bounds + slo_bounds(cfg.slo), planned)
