#!/usr/bin/env python3
"""How noisy the "queue growing" reading is, and how much of an overload it
sees: the time in the server from the middle third of a window to the last,
read per request served (qtune.metrics.keeps_up's held_growth) and per request
sent (requests in flight at a third's sends over its sends,
held_growth_per_send), and qtune's verdict, past the limit both ways, side by
side on the same simulated windows.

No server: the windows are Poisson sends into a server with room for every
request (its time per request drawn around ``--service``: +-50% uniform, as
fixed output lengths give, or exponential or lognormal, as a dataset's mix
of lengths gives), the last third sending 1.0-1.5x more; and
first-come-first-served queues offered 1.1-2x what they serve.  The noise
of either reading is a property of the schedule and the count, which a
simulation gives exactly; what a real engine
adds (its own batching) is in the GPU runs of RESULTS.md.

    python benchmarks/held_growth_noise.py --windows 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import fifo  # noqa: E402

from qtune.bench import HELD_GROWTH_MAX  # noqa: E402
from qtune.load.client import RequestSample  # noqa: E402
from qtune.metrics import keeps_up  # noqa: E402

# How a request's time in the server is drawn around its mean: fixed output
# lengths (qtune's synthetic workloads, +-50% uniform) against the wide mixes
# of a dataset (exponential; lognormal with sigma 1).
SPREADS = {
    "uniform +-50%": lambda rng: 0.5 + rng.random(),
    "exponential": lambda rng: rng.expovariate(1.0),
    "lognormal s=1": lambda rng: rng.lognormvariate(-0.5, 1.0),
}


def stable(rate: float, more: float, third_s: float, service_s: float, spread: str,
           seed: int) -> list[RequestSample]:
    rng, times = random.Random(seed), random.Random(seed + 1)
    out, t = [], 0.0
    for k, r in enumerate((rate, rate, rate * more)):
        end = (k + 1) * third_s
        while True:
            t += rng.expovariate(r)
            if t >= end:
                t = end
                break
            e2e = service_s * SPREADS[spread](times)
            out.append(RequestSample(start=t, ttft=0.05, e2e=e2e, output_tokens=8))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=400)
    ap.add_argument("--third", type=float, default=10.0, help="seconds per third")
    ap.add_argument("--service", type=float, default=3.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"stable server, {args.windows} windows a rate, thirds of {args.third:g} s, "
          f"{args.service:g} s a request on average, last third 1.0-1.5x the sends")
    print(f"{'time a request':>14} {'req/s':>6} {'reading':>11} {'sd':>6} {'min':>6} "
          f"{'max':>6} {'>' + str(HELD_GROWTH_MAX) + 'x':>7}")
    for spread in SPREADS:
        for rate in (10.0, 20.0, 40.0):
            got: dict[str, list[float]] = {"per send": [], "per request": []}
            for i in range(args.windows):
                k = keeps_up(stable(rate, 1.0 + 0.5 * (i % 5) / 4, args.third, args.service,
                                    spread, i), rate)
                got["per send"].append(k["held_growth_per_send"])
                got["per request"].append(k["held_growth"])
            # qtune's verdict: past the limit both ways
            both = sum(min(a, b) > HELD_GROWTH_MAX
                       for a, b in zip(got["per send"], got["per request"], strict=True))
            sds = {}
            for name, v in got.items():
                sds[name] = statistics.pstdev(v)
                over = sum(x > HELD_GROWTH_MAX for x in v) / len(v)
                print(f"{spread:>14} {rate:6.0f} {name:>11} {sds[name]:6.3f} {min(v):6.2f} "
                      f"{max(v):6.2f} {over:7.1%}")
                rows.append({"case": "stable", "spread": spread, "rate": rate,
                             "reading": name, "sd": sds[name], "min": min(v), "max": max(v),
                             "over_limit": over})
            print(f"{'':>14} {'':6} sd per request / per send: "
                  f"{sds['per request'] / sds['per send']:.2f}; past the limit both ways "
                  f"(qtune's verdict): {both / args.windows:.1%}")
            rows.append({"case": "stable", "spread": spread, "rate": rate, "reading": "both",
                         "over_limit": both / args.windows})
    print(f"\nFIFO queue serving 20 req/s (40 slots x 2 s), {args.third * 3:g} s windows, "
          f"{args.windows // 4} windows a load: share read as growing (> {HELD_GROWTH_MAX}x)")
    for over in (1.1, 1.3, 1.6, 2.0):
        got = {"per send": [], "per request": []}
        for i in range(args.windows // 4):
            k = keeps_up(fifo(20.0 * over, args.third * 3, 40, 2.0, i), 20.0 * over)
            got["per send"].append(k["held_growth_per_send"])
            got["per request"].append(k["held_growth"])
        got["both"] = [min(a, b) for a, b in zip(got["per send"], got["per request"],
                                                 strict=True)]
        line = []
        for name, v in got.items():
            seen = sum(x > HELD_GROWTH_MAX for x in v) / len(v)
            line.append(f"{name} {seen:.0%} (median {statistics.median(v):.2f}x)")
            rows.append({"case": "queue", "overload": over, "reading": name,
                         "seen": seen, "median": statistics.median(v)})
        print(f"  offered {over:.1f}x: " + "; ".join(line))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
