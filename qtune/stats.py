"""Statistics over repeated measurements: the median with a bootstrap 95%
interval, and the ratio of two medians with its interval (bench's repeats
and comparisons, verify's A/B, the search's confirmation of the top
configs).  Pure; seeded, so a report reads the same every time."""

from __future__ import annotations

import math
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
