#!/usr/bin/env python3
"""Does a capacity probe's verdict follow its send times?  Reads the
``result.json`` of ``capacity_fast_vs_full.py`` runs, rebuilds each probe's
send times from its seed (``qtune.seeds``: the run's seed, the probe's
number; ``qtune.load``: gamma/exponential gaps rescaled to the window), and
pairs probes of one load:

- *same send times*: the same seed and probe number in two runs (another
  server, often another config), where the exponential draws are the same
  and only their rescaling to the probe's request count differs;
- *own send times*: two probes of one load on one server, with seeds of their
  own.

Prints each pair and, for either kind, how often the two verdicts agree and
the mean gap between their TPOT (or first SLO metric) p99.  A probe that
stopped early is left out (its percentiles are of a part of its window).

Then, for every whole probe, its sends in the middle and the last third of
its window and the growth of the requests in flight between them, read two
ways: as requests in flight (``qtune.metrics.keeps_up`` before 2026-12-07)
and per request sent (the time in the server, after): which probes each
reading calls "queue growing" (``qtune.bench.HELD_GROWTH_MAX``).

    cd benchmarks/gpu-h200 && python ../verdict_by_schedule.py \\
        --run run25=run25-fvf-control/raw/result.json:full=0,fast=1,full_again=5 \\
        --run run26=run26-fvf-config1/raw/result.json:full=0,fast=1

Each ``--run NAME=PATH:PROC=SEED,...`` names which seed each procedure's
search ran with (``capacity_fast_vs_full.py`` before 2026-12-07: 1000 x
config + its turn; since 2026-12-07, 1000 x config + 100 x its turn).  A
run with ``--shared-arrivals`` sent on another seed: not for this script.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from qtune import seeds  # noqa: E402
from qtune.bench import HELD_GROWTH_MAX  # noqa: E402
from qtune.load import _normalised, inter_arrivals  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.seeds import Phase  # noqa: E402


def send_times(seed: int, rate: float, n: int) -> list[float]:
    """What ``qtune.load`` sends for a count-bound Poisson probe: its own
    gaps (``inter_arrivals``), rescaled as it rescales them (``_normalised``),
    the first request at 0."""
    gap = _normalised(inter_arrivals(Workload(rate=rate, requests=n), random.Random(seed)),
                      n, rate)
    return list(itertools.accumulate((gap() for _ in range(n - 1)), initial=0.0))


def peak(ts: list[float], span: float) -> int:
    """The most requests sent within any ``span`` seconds."""
    return max(bisect.bisect_left(ts, t + span) - i for i, t in enumerate(ts))


def probes(name: str, path: Path, bases: dict[str, int], metric: str) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    out = []
    for ci, cfg in enumerate(data["configs"]):
        for proc, turn in bases.items():
            res = cfg.get(proc)
            if not res:
                continue
            base = 1000 * ci + turn
            for number, st in enumerate(res.get("steps") or [], 1):
                whole = "stopped early" not in str(st.get("why"))
                seed = seeds.seed(base, Phase.PROBE, number)
                ts = send_times(seed, float(st["load"]), int(st["requests"]))
                third = ts[-1] / 3
                out.append({"sent_mid": sum(third <= t < 2 * third for t in ts),
                            "sent_last": sum(t >= 2 * third for t in ts),
                            "held_growth": st.get("held_growth"),
                            "run": name, "config": ci, "proc": proc, "number": number,
                            "seed": seed, "load": float(st["load"]),
                            "requests": int(st["requests"]), "held": bool(st["ok"]),
                            "value": st.get(metric), "whole": whole,
                            "why": str(st.get("why"))[:48],
                            "peak2": peak(ts, 2.0)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True,
                    help="NAME=PATH:PROC=SEED,... (see the module's docstring)")
    ap.add_argument("--metric", default="tpot_p99")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for spec in a.run:
        name, _, rest = spec.partition("=")
        path, _, procs = rest.rpartition(":")
        bases = {p: int(s) for p, s in (kv.split("=") for kv in procs.split(","))}
        rows += probes(name, Path(path), bases, a.metric)
    whole = [r for r in rows if r["whole"]]
    same = [(x, y) for x, y in itertools.combinations(whole, 2)
            if x["seed"] == y["seed"] and x["load"] == y["load"] and x["run"] != y["run"]]
    own = [(x, y) for x, y in itertools.combinations(whole, 2)
           if x["seed"] != y["seed"] and x["load"] == y["load"]
           and (x["run"], x["config"]) == (y["run"], y["config"])]

    def show(kind: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        print(f"{kind}: {len(pairs)} pairs")
        for x, y in pairs:
            print(f"  {x['load']:g} req/s  {x['run']} {x['proc']} #{x['number']} "
                  f"{'held' if x['held'] else 'FAILED'} {x['value']}  |  "
                  f"{y['run']} {y['proc']} #{y['number']} "
                  f"{'held' if y['held'] else 'FAILED'} {y['value']}  "
                  f"(peak 2 s: {x['peak2']}, {y['peak2']})")
        if pairs:
            agree = sum(x["held"] == y["held"] for x, y in pairs)
            gaps = [abs(x["value"] - y["value"]) for x, y in pairs
                    if x["value"] is not None and y["value"] is not None]
            print(f"  verdicts agree in {agree} of {len(pairs)} ({agree / len(pairs):.0%}); "
                  f"mean |difference| of {a.metric} {sum(gaps) / len(gaps):.2f}")

    show("same send times (same seed and probe number, another run)", same)
    show("own send times (one load, one server, seeds of their own)", own)
    print("\nqueue growth, whole probes (sends middle -> last third; in flight; per send)")
    before = after = 0
    for r in whole:
        g = r["held_growth"]
        if g is None:
            continue
        per_send = g * r["sent_mid"] / r["sent_last"]
        was, now = g > HELD_GROWTH_MAX, per_send > HELD_GROWTH_MAX
        before, after = before + was, after + now
        print(f"  {r['run']} {r['proc']} #{r['number']} {r['load']:g} req/s  sends "
              f"{r['sent_mid']} -> {r['sent_last']} ({r['sent_last'] / r['sent_mid']:.2f}x)  "
              f"in flight {g:.2f}x{' GROWING' if was else ''}  per send {per_send:.2f}x"
              f"{' GROWING' if now else ''}  [{r['why']}]")
    print(f"  over {HELD_GROWTH_MAX}x: {before} probes read as requests in flight, "
          f"{after} per request sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
