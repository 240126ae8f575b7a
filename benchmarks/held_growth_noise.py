#!/usr/bin/env python3
"""How noisy the "queue growing" reading is, and how much of an overload it
sees: qtune.metrics.keeps_up's held_growth (the mean time in the server of the
requests sent in the last third over the middle third) side by side with the
reading it replaced (requests in flight at the sends of a third over the sends
in it, Little's law the other way round), on the same simulated windows.

No server: the windows are Poisson sends into a server with room for every
request (its time per request drawn +-``--spread`` around ``--service``), the
last third sending 1.0-1.5x more; and first-come-first-served queues offered
1.1-2x what they serve.  The noise of either reading is a property of the
schedule and the count, which a simulation gives exactly; what a real engine
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qtune.bench import HELD_GROWTH_MAX  # noqa: E402
from qtune.load.client import RequestSample  # noqa: E402
from qtune.metrics import in_flight_at_sends, keeps_up  # noqa: E402


def stable(rate: float, more: float, third_s: float, service_s: float, spread: float,
           seed: int) -> list[RequestSample]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for k, r in enumerate((rate, rate, rate * more)):
        end = (k + 1) * third_s
        while True:
            t += rng.expovariate(r)
            if t >= end:
                t = end
                break
            e2e = service_s * (1 + spread * (2 * rng.random() - 1))
            out.append(RequestSample(start=t, ttft=0.05, e2e=e2e, output_tokens=8))
    return out


def queue(rate: float, window_s: float, slots: int, service_s: float,
          seed: int) -> list[RequestSample]:
    rng = random.Random(seed)
    free = [0.0] * slots
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= window_s:
            return out
        k = min(range(slots), key=free.__getitem__)
        begin = max(t, free[k])
        free[k] = begin + service_s
        out.append(RequestSample(start=t, ttft=begin - t + 0.05, e2e=free[k] - t,
                                 output_tokens=8))


def per_send(samples: list[RequestSample]) -> float:
    """The replaced reading: mean requests in flight at a third's sends over
    its sends, last third over middle."""
    sends = sorted(s.start for s in samples)
    t0, t1 = sends[0], sends[-1]
    a, b = t0 + (t1 - t0) / 3, t0 + 2 * (t1 - t0) / 3
    held = in_flight_at_sends(samples)
    mid = [n for t, n in held if a <= t < b]
    last = [n for t, n in held if t >= b]
    return (sum(last) / len(last) ** 2) / (sum(mid) / len(mid) ** 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=400)
    ap.add_argument("--third", type=float, default=10.0, help="seconds per third")
    ap.add_argument("--service", type=float, default=3.0)
    ap.add_argument("--spread", type=float, default=0.5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"stable server, {args.windows} windows a rate, thirds of {args.third:g} s, "
          f"{args.service:g} s +-{args.spread:.0%} a request, last third 1.0-1.5x the sends")
    print(f"{'req/s':>6} {'reading':>10} {'sd':>6} {'min':>6} {'max':>6} "
          f"{'>' + str(HELD_GROWTH_MAX) + 'x':>7}")
    for rate in (10.0, 20.0, 40.0):
        got: dict[str, list[float]] = {"per send": [], "per request": []}
        for i in range(args.windows):
            s = stable(rate, 1.0 + 0.5 * (i % 5) / 4, args.third, args.service,
                       args.spread, i)
            got["per send"].append(per_send(s))
            got["per request"].append(keeps_up(s, rate)["held_growth"])
        sds = {}
        for name, v in got.items():
            sds[name] = statistics.pstdev(v)
            over = sum(x > HELD_GROWTH_MAX for x in v) / len(v)
            print(f"{rate:6.0f} {name:>11} {sds[name]:6.3f} {min(v):6.2f} {max(v):6.2f} "
                  f"{over:7.1%}")
            rows.append({"case": "stable", "rate": rate, "reading": name, "sd": sds[name],
                         "min": min(v), "max": max(v), "over_limit": over})
        print(f"{'':6} sd per request / per send: {sds['per request'] / sds['per send']:.2f}")
    print(f"\nFIFO queue serving 20 req/s (40 slots x 2 s), {args.third * 3:g} s windows, "
          f"{args.windows // 4} windows a load: share read as growing (> {HELD_GROWTH_MAX}x)")
    for over in (1.1, 1.3, 1.6, 2.0):
        got = {"per send": [], "per request": []}
        for i in range(args.windows // 4):
            s = queue(20.0 * over, args.third * 3, 40, 2.0, i)
            got["per send"].append(per_send(s))
            got["per request"].append(keeps_up(s, 20.0 * over)["held_growth"])
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
