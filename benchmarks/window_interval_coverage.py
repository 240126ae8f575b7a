#!/usr/bin/env python3
"""Can one probe window state how sure its p99 is?  A bootstrap interval of one
window's TTFT p99, over its requests or over blocks of its send time, against
the p99 the same load gives over hundreds of windows, on a stand-in queue.

No server: Poisson sends into a first-come-first-served server of 40 slots of
2 s +-20% (20 req/s), a window of ``--window`` s after as long a warm-up, at
loads from 60% to 97.5% of what it serves.  Near its capacity a queue's state
wanders for longer than a window, so the window's p99 is its own excursion's;
this prints how often a 95% interval from one window holds the load's p99,
and how far one window's p99 strays.  Why qtune's capacity confirmation says
a bracket and the verdicts of fresh windows, not an interval from one window
(issue 27).

    python benchmarks/window_interval_coverage.py --windows 120 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import fifo  # noqa: E402


def window(rate: float, window_s: float, seed: int) -> tuple[list[float], list[float]]:
    """(send times, TTFT ms) of the requests sent in the window after a warm-up
    as long as the window, on 40 slots of 2 s +-20%."""
    got = fifo(rate, 2 * window_s, 40, 2.0, seed, jitter=0.2, from_s=window_s)
    return [s.start for s in got], [s.ttft * 1000 for s in got]


def interval(starts: list[float], values: list[float], block_s: float,
             seed: int) -> tuple[float, float]:
    """95% bootstrap interval of the p99, resampling blocks of ``block_s`` of
    send time (a block a request: ``block_s`` 0)."""
    v = np.asarray(values)
    if block_s <= 0:
        blocks = [v[i:i + 1] for i in range(len(v))]
    else:
        idx = np.floor((np.asarray(starts) - min(starts)) / block_s).astype(int)
        blocks = [v[idx == b] for b in np.unique(idx)]
    rng = np.random.default_rng(seed)
    boots = [np.percentile(np.concatenate([blocks[i] for i in row]), 99)
             for row in rng.integers(0, len(blocks), size=(400, len(blocks)))]
    return float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=120)
    ap.add_argument("--window", type=float, default=20.0, help="seconds")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    print(f"FIFO stand-in serving 20 req/s, {a.window:g} s windows, TTFT p99; the load's "
          f"p99 from {3 * a.windows} other windows")
    print(f"{'load':>6} {'load p99':>9} {'window p99 sd':>13} {'per request':>22} "
          f"{'blocks of 2 s':>22} {'blocks of 4 s':>22}")
    for share in (0.6, 0.75, 0.9, 0.975):
        rate = 20.0 * share
        pool = [x for s in range(10_000, 10_000 + 3 * a.windows)
                for x in window(rate, a.window, s)[1]]
        truth = float(np.percentile(pool, 99))
        reads, cover = [], {0.0: 0, 2.0: 0, 4.0: 0}
        width = {k: 0.0 for k in cover}
        for s in range(a.windows):
            starts, ttft = window(rate, a.window, s)
            reads.append(float(np.percentile(ttft, 99)))
            for b in cover:
                lo, hi = interval(starts, ttft, b, s)
                cover[b] += lo <= truth <= hi
                width[b] += (hi - lo) / a.windows
        sd = statistics.stdev(reads)
        cells = [f"{cover[b] / a.windows:6.0%} held, {width[b]:6.0f} ms" for b in cover]
        print(f"{share:6.1%} {truth:7.0f}ms {sd:10.0f} ms " + " ".join(f"{c:>22}" for c in cells))
        rows.append({"load_share": share, "rate": rate, "load_p99_ms": truth,
                     "window_p99_sd_ms": sd,
                     **{f"cover_block_{b:g}s": cover[b] / a.windows for b in cover},
                     **{f"width_block_{b:g}s_ms": width[b] for b in cover}})
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
