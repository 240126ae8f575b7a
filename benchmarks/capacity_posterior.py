#!/usr/bin/env python3
"""Read a capacity search's probes as noisy verdicts, not as a bisection: fit
P(a window holds load x) = 1 / (1 + exp((ln x - ln c) / s)) to every probe of
one search (qtune.stats.capacity_from_verdicts: a grid posterior over the
capacity c, where a window holds half the time, and the spread s), and give
c with a 90% credible interval.  Then,
per config, whether the searches run on one server (full, fast, full again
in ``capacity_fast_vs_full.py --control``) agree under that reading: their
intervals overlap, and each holds the capacity read from all their probes
together.

No run of its own: it reads the JSON that capacity_fast_vs_full.py wrote.

    python benchmarks/capacity_posterior.py \\
        benchmarks/gpu-h200/run25-fvf-control/raw/result.json \\
        benchmarks/results/capacity-fast-vs-full-20261207d/result.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qtune.capacity_types import step_verdicts  # noqa: E402
from qtune.stats import capacity_from_verdicts  # noqa: E402


def summary(probes: list[tuple[float, bool]]) -> tuple[float, float, float]:
    """(capacity, 5%, 95%) as qtune.stats.capacity_from_verdicts reads them
    (nan: no window held, or none failed)."""
    v = capacity_from_verdicts(probes)
    return (v.median, v.low, v.high) if v else (math.nan, math.nan, math.nan)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    agree = {"bracket": [0, 0], "interval": [0, 0], "others": [0, 0]}
    for path in a.results:
        data = json.loads(path.read_text())
        for i, cfg in enumerate(data["configs"]):
            runs = {k: cfg[k] for k in ("full", "fast", "full_again") if cfg.get(k)}
            probes = {k: step_verdicts(v.get("steps") or []) for k, v in runs.items()}
            loads = [p[0] for v in probes.values() for p in v]
            if not loads:
                continue
            pooled = summary([p for v in probes.values() for p in v])
            print(f"{path.parent.name if path.parent.name != 'raw' else path.parent.parent.name}"
                  f" config {i} {json.dumps(cfg['params']) if cfg['params'] else 'defaults'}:"
                  f" all {sum(len(v) for v in probes.values())} probes: capacity "
                  f"{pooled[0]:.3g} (90% {pooled[1]:.3g}-{pooled[2]:.3g})")
            ivs = {}
            for k, v in runs.items():
                med, l5, u95 = summary(probes[k])
                ivs[k] = (l5, u95)
                br = v.get("bracket")
                # the others' probes only: a figure this search did not help read
                others = summary([p for o, v in probes.items() if o != k for p in v])[0] \
                    if len(probes) > 1 else math.nan
                print(f"    {k:10s} bracket {br}  capacity {med:.3g} (90% {l5:.3g}-{u95:.3g})"
                      f"  holds the pooled {pooled[0]:.3g}: "
                      f"{'yes' if l5 <= pooled[0] <= u95 else 'NO'}"
                      + (f"; the others' {others:.3g}: "
                         f"{'yes' if l5 <= others <= u95 else 'NO'}"
                         if not math.isnan(others) else ""))
                if not math.isnan(others):
                    agree["others"][1] += 1
                    agree["others"][0] += l5 <= others <= u95
                rows.append({"file": str(path), "config": i, "run": k, "bracket": br,
                             "median": med, "ci90": [l5, u95], "pooled": pooled[0],
                             "probes": len(probes[k])})
            keys = list(runs)
            for x in range(len(keys)):
                for y in range(x + 1, len(keys)):
                    b1, b2 = runs[keys[x]].get("bracket"), runs[keys[y]].get("bracket")
                    if b1 and b2:  # [held, failed): None, nothing held or failed
                        agree["bracket"][1] += 1
                        low = max(-math.inf if b[0] is None else b[0] for b in (b1, b2))
                        high = min(math.inf if b[1] is None else b[1] for b in (b1, b2))
                        agree["bracket"][0] += low < high
                    i1, i2 = ivs[keys[x]], ivs[keys[y]]
                    agree["interval"][1] += 1
                    agree["interval"][0] += max(i1[0], i2[0]) <= min(i1[1], i2[1])
    print(f"\npairs of searches of one config on one server whose brackets overlap: "
          f"{agree['bracket'][0]} of {agree['bracket'][1]}; whose 90% intervals overlap: "
          f"{agree['interval'][0]} of {agree['interval'][1]}; searches whose interval holds "
          f"the capacity read from the other searches' probes: {agree['others'][0]} of "
          f"{agree['others'][1]}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "agree": agree}, indent=1,
                                     allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
