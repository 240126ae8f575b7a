#!/usr/bin/env python3
"""The fast capacity procedure against the full one, side by side on one
server per config (issue 27, item 3 and its "done when").

For each config: one server starts; on it the full procedure (before issue
27: double from --rate, bisect to the tolerance, no early stop) and the fast
one (early stop of certain failures, the served rate as a hint) run in turn,
their order alternated between configs; then, for every config after the
first, the fast procedure with the first config's fast capacity as its floor
(what a search trial after the baseline runs: a config below the incumbent
costs one probe).  Each probe has prompts of its own; the server's prefix
cache is emptied before each.

Prints, per config: each procedure's capacity, bracket, probes and measuring
time; whether the fast answer lies in the full bracket, and whether the two
searches' 90% intervals read from every verdict overlap (``from_verdicts``);
the time ratio.

``--control``: the full procedure runs again after the fast one (full, fast,
full on each server), and the table says whether the second full answer
lies in the first's bracket: how often the full procedure agrees with
itself is the yardstick for how often the fast one can agree with it.

    python benchmarks/capacity_fast_vs_full.py \\
        --configs '[{}, {"max_num_seqs": 1, "VLLM_CPU_KVCACHE_SPACE": 4}]' \\
        --input-len 128 --output-len 128 --rate 2 --requests 20 --warmup 8 \\
        --slo 'e2e_p99<=3000ms' --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import launch, set_server_nice, table, wait_until_alone  # noqa: E402

from qtune.bench import BenchConfig  # noqa: E402
from qtune.capacity import FAST, FULL, CapacityPlan, CapacityResult, find_capacity  # noqa: E402
from qtune.engines.vllm import VLLM  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.objectives import parse_slo  # noqa: E402


def run(url: str, model: str, tok: str, a: argparse.Namespace, plan: CapacityPlan,
        seed: int, arrivals: int) -> dict[str, Any]:
    # Each search its own prompts (its seed; a probe's is the seed plus its
    # number, so the seeds are 100 apart) and, as qtune sends them, send
    # times of each probe's own; with --shared-arrivals every probe on the
    # server sends on one schedule (scaled to its load), re-measures too.
    wl = Workload(input_len=a.input_len, output_len=a.output_len, rate=a.rate,
                  requests=a.requests, warmup_requests=a.warmup, seed=seed,
                  _arrival_seed=arrivals if a.shared_arrivals else None)
    eng = VLLM()
    cfg = BenchConfig(urls=[url], workload=wl, model=model, tokenizer=Path(tok),
                      slo=parse_slo(a.slo), capacity_window=a.window,
                      capacity_tolerance=a.tolerance, metric_names=eng.metric_names(),
                      reset_paths=eng.cache_reset_paths(), gauge_interval=None)
    t0 = time.monotonic()
    cap: CapacityResult = find_capacity(url, model, cfg, plan=plan)
    wall = time.monotonic() - t0
    d = cap.to_dict()
    lags = [float(st["client_lag_max_ms"]) for st in d.get("steps") or []
            if st.get("client_lag_max_ms") is not None]
    print(f"    {plan.procedure}{' floor ' + format(plan.floor, 'g') if plan.floor else ''}: "
          f"{d.get('value', '-')} {d.get('bracket', '')} {d['probes']} probes "
          f"{wall:.0f} s (saved {d['saved_s']:.0f} s)"
          + (f" below {cap.below:g}" if cap.below is not None else "")
          + (f"; verdicts went either way in {list(cap.noise_band)}" if cap.noise_band else "")
          + (f"; client loop late {max(lags):.0f} ms at most" if lags else ""),
          flush=True)
    return {"procedure": plan.procedure, "floor": plan.floor, "wall_s": wall, **d}


def within(fast: dict[str, Any], full: dict[str, Any]) -> str:
    if not fast.get("found") or not full.get("found"):
        return "n/a"
    lo, hi = full["bracket"]
    ok = lo <= fast["value"] and (hi is None or fast["value"] < hi)
    return "yes" if ok else "NO"


def overlap(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Do two searches' 90% intervals read from every verdict overlap
    (qtune.stats.capacity_from_verdicts; benchmarks/capacity_posterior.py)?"""
    ia, ib = ((d.get("from_verdicts") or {}).get("ci90") for d in (a, b))
    if not ia or not ib:
        return "n/a"
    return "yes" if max(ia[0], ib[0]) <= min(ia[1], ib[1]) else "NO"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--configs", default="[{}]", help="JSON list of launch params")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--slo", default="e2e_p99<=3000ms")
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the fast run with config 0's capacity as floor "
                         "(saves its probes where device time is short)")
    ap.add_argument("--control", nargs="?", const="all", default=None,
                    help="run the full procedure again after the fast one (full, fast, "
                         "full): does the full procedure agree with itself?  Alone: on "
                         "every config; with indices ('0' or '0,2'): on those only, "
                         "where device time is short")
    ap.add_argument("--shared-arrivals", action="store_true",
                    help="every probe on a server sends on one schedule, scaled to its "
                         "load (common random numbers; qtune gives each probe its own)")
    ap.add_argument("--server-nice", type=int, default=None,
                    help="the server's autogroup nice (Linux): on a host where the "
                         "server and this client share the cores, 10 keeps the "
                         "client's loop on time (both procedures measure alike)")
    a = ap.parse_args()
    configs = json.loads(a.configs)
    controlled = (set() if a.control is None else set(range(len(configs)))
                  if a.control == "all" else {int(i) for i in a.control.split(",")})
    wait_until_alone()
    rows, out = [], []
    incumbent: float | None = None
    t_all = time.monotonic()
    for i, params in enumerate(configs):
        work = Path(tempfile.mkdtemp(prefix="qtune-fvf-"))
        server, spec, tok = launch(a.model, params, work)
        print(f"config {i} {params or 'engine defaults'}", flush=True)
        with server:
            if a.server_nice is not None:
                assert server.proc is not None
                set_server_nice(server.proc.pid, a.server_nice)
            server.wait_ready(a.startup_timeout)
            control = i in controlled
            order = (FULL, FAST) if i % 2 == 0 or control else (FAST, FULL)
            res = {p: run(spec.base_url, spec.served_model, tok, a,
                          CapacityPlan(start=a.rate, tolerance=a.tolerance, procedure=p),
                          seed=1000 * i + 100 * k, arrivals=1000 * i + 999)
                   for k, p in enumerate(order)}
            again = (run(spec.base_url, spec.served_model, tok, a,
                         CapacityPlan(start=a.rate, tolerance=a.tolerance, procedure=FULL),
                         seed=1000 * i + 500, arrivals=1000 * i + 999) if control else None)
            floored = None
            if incumbent is not None and not a.no_floor:
                floored = run(spec.base_url, spec.served_model, tok, a,
                              CapacityPlan(start=a.rate, floor=incumbent,
                                           tolerance=a.tolerance, floor_of="config 0"),
                              seed=1000 * i + 700, arrivals=1000 * i + 999)
        if i == 0 and res[FAST].get("found"):
            incumbent = float(res[FAST]["value"])
        full, fast = res[FULL], res[FAST]
        out.append({"params": params, "full": full, "fast": fast, "floored": floored,
                    "full_again": again})

        def show(d: dict[str, Any]) -> str:
            if d.get("below") is not None:
                return f"below {d['below']:g}"
            return (f"{d['value']:g} [{d['bracket'][0]:g}, "
                    f"{'-' if d['bracket'][1] is None else format(d['bracket'][1], 'g')})"
                    if d.get("found") and d.get("bracket") else str(d.get("value", "-")))

        rows.append([str(i), json.dumps(params) if params else "defaults",
                     show(full), f"{full['probes']}", f"{full['probes_s']:.0f}",
                     show(fast), f"{fast['probes']}", f"{fast['probes_s']:.0f}",
                     within(fast, full), overlap(fast, full),
                     f"{fast['probes_s'] / full['probes_s']:.2f}",
                     (f"{show(floored)}: {floored['probes']} / {floored['probes_s']:.0f} s"
                      if floored else "-")]
                    + ([show(again), within(again, full), within(full, again),
                        within(fast, again)] if again else
                       ["-"] * 4 if controlled else []))
        if a.json:  # after each config: a run cut short keeps what it measured
            a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)},
                                          "configs": out}, indent=1, default=str))
    print()
    print(table(["#", "config", "full", "probes", "s", "fast", "probes", "s",
                 "fast in full bracket", "90% intervals overlap", "time fast/full",
                 "fast with config 0 as floor"]
                + (["full again", "in full's bracket", "full in its bracket",
                    "fast in its bracket"] if controlled else []),
                rows))
    print(f"\nwall time {time.monotonic() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
