"""Statistics over repeated measurements: the median with a bootstrap 95%
interval, and the ratio of two medians with its interval (bench's repeats
and comparisons, verify's A/B, the search's confirmation of the top
configs); a capacity read from its windows' verdicts with a credible
interval (the capacity search and its confirmation).  Pure; seeded, so a
report reads the same every time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def bootstrap_median(
    values: list[float], seed: int = 0
) -> tuple[float, float | None, float | None]:
    """The median and its bootstrap 95% interval (None, None under 3 values)."""
    arr = np.asarray(values, dtype=float)
    med = float(np.median(arr))
    if arr.size < 3:
        return med, None, None
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(arr, size=(2000, arr.size), replace=True), axis=1)
    return med, float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def ratio_ci(a: list[float], b: list[float], seed: int = 0) -> dict[str, Any]:
    """Ratio of medians b/a with a bootstrap 95% interval."""
    A, B = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratio = float(np.median(B) / np.median(A)) if np.median(A) else math.nan
    if A.size < 3 or B.size < 3:
        return {"ratio": ratio, "ci95": None}
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(A, size=(2000, A.size)), axis=1)
    mb = np.median(rng.choice(B, size=(2000, B.size)), axis=1)
    r = mb / np.where(ma == 0, np.nan, ma)
    return {"ratio": ratio, "ci95": [float(np.nanpercentile(r, 2.5)),
                                     float(np.nanpercentile(r, 97.5))]}


# The spread of a window's verdict around a capacity: log-uniform from 0.5% to
# 20% of the load per logistic unit.  Separated verdicts (a clean bracket) say
# little of it; this keeps it from running to a step or a flat line.  Over
# the searches of benchmarks/capacity_posterior.py (GPU runs 14, 25, 26; CPU
# 2026-12-07c/d) 0.5-10% gave 15 of 18 pairs overlapping, 1-30% 18 of 18 (the
# range was chosen before those pairs were scored, but scored on them alone:
# an in-sample figure until a device run adds searches).
_SPREADS = np.exp(np.linspace(math.log(0.005), math.log(0.2), 48))


@dataclass(frozen=True)
class VerdictCapacity:
    """A capacity read from every window's verdict as a noisy one: the load a
    window holds half the time, with a 90% credible interval."""

    median: float
    low: float  # 5%
    high: float  # 95%
    windows: int

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "ci90": [self.low, self.high],
                "windows": self.windows}

    def text(self, unit: str) -> str:
        return (f"{self.median:,.4g} {unit} (90% interval {self.low:,.4g}-{self.high:,.4g})"
                f" read from {self.windows} windows' verdicts")

    @classmethod
    def from_dict(cls, d: Any) -> VerdictCapacity | None:
        """What ``to_dict`` wrote, or None for anything else: a study of a
        qtune that wrote none, or a study file that says what no fit gives
        (it is read as untrusted data)."""
        if not isinstance(d, dict):
            return None
        try:
            if "ci90" in d:  # to_dict's
                lo, hi = d["ci90"]
            else:  # a Recommendation's (dataclasses.asdict)
                lo, hi = d["low"], d["high"]
            v = cls(float(d["median"]), float(lo), float(hi), int(d["windows"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        ok = all(math.isfinite(x) and x > 0 for x in (v.median, v.low, v.high)) \
            and v.low <= v.median <= v.high and v.windows >= 2
        return v if ok else None


def capacity_from_verdicts(verdicts: Sequence[tuple[float, bool]]) -> VerdictCapacity | None:
    """Fit P(a window holds load x) = 1 / (1 + exp((ln x - ln c) / s)) to
    ``verdicts`` ((load, held) of each window): a grid posterior, flat in
    ln c, ``_SPREADS`` for s; the median of c and its 5-95% interval.  None
    unless a window held and one failed.

    Why: near the knee a window's verdict is a coin toss (on one H100 every
    load from 18 to 22 req/s both held and failed, run 25), so a bracket
    [held, failed) pins a capacity finer than the measurement: two searches
    of one config on one server had overlapping brackets in 3 of 18 pairs,
    and overlapping 90% intervals read this way in 17 of 18
    (benchmarks/capacity_posterior.py)."""
    pts = [(float(x), bool(h)) for x, h in verdicts if 0 < x < 1e12]
    if not any(h for _, h in pts) or all(h for _, h in pts):
        return None
    x = np.log(np.array([p[0] for p in pts]))
    y = np.array([p[1] for p in pts], dtype=float)
    grid = np.linspace(x.min() - math.log(3.0), x.max() + math.log(3.0), 800)
    z = (x[None, None, :] - grid[None, :, None]) / _SPREADS[:, None, None]
    ll = (y * -np.logaddexp(0.0, z) + (1 - y) * -np.logaddexp(0.0, -z)).sum(axis=2)
    post = np.exp(ll - ll.max()).sum(axis=0)
    cdf = np.cumsum(post) / post.sum()
    lo, med, hi = (float(math.exp(grid[min(int(np.searchsorted(cdf, q)), grid.size - 1)]))
                   for q in (0.05, 0.5, 0.95))
    return VerdictCapacity(float(f"{med:.4g}"), float(f"{lo:.4g}"), float(f"{hi:.4g}"),
                           len(pts))
