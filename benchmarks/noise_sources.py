#!/usr/bin/env python3
"""Where does run-to-run noise come from: the start, or the run?

A search compares configs by one measurement each, from one server start
each.  On the 2-vCPU VM the same config varies by 16-24% between such
measurements, more than the 5% a search is asked to resolve.  This script
splits that spread in two, for one profile:

- **within a start**: the same server measured ``--runs`` times in a row,
  on the same prompts;
- **between starts**: ``--starts`` fresh servers of the same config.

It prints each start's runs, then per variant the pooled within-start
coefficient of variation, the spread of start means, and the one-way
random-effects split of the variance (between-start share).  Next to the
observed within-start spread it prints what one run could say of its own
noise (batch means over five consecutive windows): where that understates
the observed spread, the noise lives on time scales longer than a run, and
only repeated runs and starts can measure it.  If most of the
variance is between starts, longer measurements cannot help; repeated starts
(``qtune search --confirm-top``, ``qtune verify``) or a steadier start can.

``--variant NAME=VAR=VALUE[,VAR=VALUE]`` adds a launch variant (extra
environment) measured in the same session, starts interleaved;
``--prefix NAME=COMMAND`` runs that variant's server under a command
(``taskset -c 1``); ``--pin-client CPUS`` pins the load client.  For example
vLLM's recommended allocator,
``--variant tcmalloc=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4``.

    python benchmarks/noise_sources.py PROFILE [--starts 4] [--runs 3]

Per measured run it also records the machine's CPU spent outside the
benchmark and its servers ("foreign") and the hypervisor's steal share.
Writes ``--json PATH`` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from _common import Monitor, fmt, table, wait_until_alone  # noqa: E402

from qtune.engines import get_engine  # noqa: E402
from qtune.load import run_load  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.metrics import metric_value, summarize  # noqa: E402
from qtune.profile import Profile  # noqa: E402
from qtune.server import Server, free_port  # noqa: E402
from qtune.verify import _with_port, profile_context  # noqa: E402


def steal_share(t0: Any, t1: Any) -> float:
    busy = sum(t1) - sum(t0)
    return (getattr(t1, "steal", 0.0) - getattr(t0, "steal", 0.0)) / busy if busy else 0.0


def batch_means(samples: list[Any], metric: str, windows: int = 5) -> float | None:
    """The run's own noise estimate for a latency percentile: the run cut
    into consecutive windows by send time, the percentile in each, their
    standard deviation over sqrt(windows), relative to the whole run's value.
    Compared with the observed spread of repeated runs, it tells whether the
    noise lives inside a run (it then agrees) or on longer time scales (it
    then understates)."""
    ok = sorted((s for s in samples if s.ok), key=lambda s: s.start)
    if len(ok) < 10 * windows:
        return None
    vals = []
    for idx in np.array_split(np.arange(len(ok)), windows):
        part = summarize([ok[i] for i in idx], 1.0)
        vals.append(metric_value(part, metric))
    whole = metric_value(summarize(ok, 1.0), metric)
    if whole is None or any(v is None for v in vals):
        return None
    return float(np.std(vals, ddof=1) / np.sqrt(windows) / whole)


def components(groups: list[list[float]]) -> dict[str, float | None]:
    """One-way random effects (equal group sizes): within-start variance,
    between-start variance component, and the between share."""
    k, m = len(groups), min(len(g) for g in groups)
    groups = [g[:m] for g in groups]
    if k < 2 or m < 2:
        return {"within_var": None, "between_var": None, "between_share": None}
    grand = statistics.fmean(v for g in groups for v in g)
    ms_within = sum((v - statistics.fmean(g)) ** 2 for g in groups for v in g) / (k * (m - 1))
    ms_between = m * sum((statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    between = max(0.0, (ms_between - ms_within) / m)
    total = between + ms_within
    return {"within_var": ms_within, "between_var": between,
            "between_share": between / total if total else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--starts", type=int, default=4, help="fresh starts per variant (4)")
    ap.add_argument("--runs", type=int, default=3, help="measurements per start (3)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=VALUE[,VAR=VALUE]: extra environment for a variant")
    ap.add_argument("--prefix", action="append", default=[],
                    help="NAME=COMMAND: run a variant's server under COMMAND "
                    "(for example 'taskset -c 1')")
    ap.add_argument("--pin-client", type=str,
                    help="CPU list for this process (the load client), e.g. 1")
    ap.add_argument("--requests", type=int, help="override the profile's request count")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--logs", type=Path, default=Path("studies/noise"), help="server logs")
    args = ap.parse_args()

    prof = Profile.load(args.profile)
    ctx = profile_context(prof)
    engine = get_engine(prof.engine.name)
    ref = engine.launch_spec({}, ctx, host="127.0.0.1", port=8000)  # as verify does
    objective = prof.metrics.get("objective", {}).get("name", "e2e_p99")
    wl = Workload(**prof.workload)
    if args.requests:
        wl = dataclasses.replace(wl, requests=args.requests)
    if args.pin_client:
        os.sched_setaffinity(0, {int(c) for c in args.pin_client.split(",")})
    prefixes = {n: c.split() for n, _, c in (p.partition("=") for p in args.prefix)}
    variants: list[tuple[str, dict[str, str]]] = [("as tuned", {})]
    for v in args.variant:
        name, _, assigns = v.partition("=")
        env = dict(a.split("=", 1) for a in assigns.split(",") if a)
        variants.append((name, env))
    variants += [(n, {}) for n in prefixes if n not in dict(variants)]
    print(f"profile {prof.name}: {objective}; {wl.requests} requests, "
          f"concurrency {wl.concurrency}, rate {wl.rate}; {args.starts} starts x "
          f"{args.runs} runs per variant: {', '.join(n for n, _ in variants)}", flush=True)

    rows: list[dict[str, Any]] = []
    args.logs.mkdir(parents=True, exist_ok=True)
    for s in range(args.starts):
        order = variants[s % len(variants):] + variants[:s % len(variants)]
        for name, extra in order:
            wait_until_alone(quiet=5.0)
            port = free_port()
            argv = prefixes.get(name, []) + _with_port(prof.argv, port)
            spec = dataclasses.replace(ref, argv=tuple(argv), env={**prof.env, **extra},
                                       port=port)
            tag = name.replace(" ", "-")
            with Server(spec, args.logs / f"{tag}-{s}.log") as server:
                ready = server.wait_ready(600, classify=engine.classify)
                for r in range(args.runs):
                    t0 = psutil.cpu_times()
                    with Monitor(own_roots=[server.proc.pid]) as mon:
                        res = asyncio.run(run_load(spec.base_url, ctx.model.served_name,
                                                   wl, tokenizer=ctx.model.tokenizer_dir))
                    summ = summarize(res.samples, res.duration)
                    row = {"variant": name, "start": s, "run": r, "ready_s": ready,
                           "value": metric_value(summ, objective),
                           "noise_est": batch_means(res.samples, objective),
                           "e2e_p99": metric_value(summ, "e2e_p99"),
                           "tpot_p50": metric_value(summ, "tpot_p50"),
                           "req_s": summ["request_throughput"],
                           "failed": summ["failed"],
                           "foreign_cpu": mon.foreign_cpu,
                           "steal": steal_share(t0, psutil.cpu_times())}
                    rows.append(row)
                    print(f"  {name} start {s} run {r}: {objective} {fmt(row['value'], 1)}, "
                          f"e2e p99 {fmt(row['e2e_p99'], 1)}, tpot p50 "
                          f"{fmt(row['tpot_p50'], 2)}, {row['req_s']:.2f} req/s, foreign "
                          f"{row['foreign_cpu']:.0%}, steal {row['steal']:.1%}", flush=True)
            time.sleep(1)

    out: dict[str, Any] = {"profile": str(args.profile), "objective": objective,
                           "starts": args.starts, "runs": args.runs, "rows": rows,
                           "variants": {}}
    head = ["variant", "start means", "within-start CV", "batch-means estimate",
            "start-mean CV", "between-start share", "median", "foreign CPU", "steal"]
    trows = []
    for name, _ in variants:
        mine = [r for r in rows if r["variant"] == name and r["value"] is not None]
        groups = [[r["value"] for r in mine if r["start"] == s] for s in range(args.starts)]
        groups = [g for g in groups if g]
        means = [statistics.fmean(g) for g in groups]
        comp = components(groups)
        grand = statistics.fmean(means)
        within_cv = (comp["within_var"] ** 0.5 / grand) if comp["within_var"] else None
        mean_cv = statistics.stdev(means) / grand if len(means) > 1 else None
        med = statistics.median(r["value"] for r in mine)
        ests = [r["noise_est"] for r in mine if r.get("noise_est") is not None]
        est = statistics.fmean(ests) if ests else None
        d = {**comp, "within_cv": within_cv, "noise_est": est, "start_mean_cv": mean_cv,
             "median": med,
             "start_means": means,
             "foreign_cpu": statistics.fmean(r["foreign_cpu"] for r in mine),
             "steal": statistics.fmean(r["steal"] for r in mine)}
        out["variants"][name] = d
        trows.append([name, " ".join(fmt(m, 0) for m in means),
                      "-" if within_cv is None else f"{within_cv:.1%}",
                      "-" if est is None else f"{est:.1%}",
                      "-" if mean_cv is None else f"{mean_cv:.1%}",
                      "-" if comp["between_share"] is None else f"{comp['between_share']:.0%}",
                      fmt(med, 1), f"{d['foreign_cpu']:.0%}", f"{d['steal']:.1%}"])
    print()
    print(table(head, trows))
    if len(variants) > 1:
        base = out["variants"]["as tuned"]["median"]
        for name, _ in variants[1:]:
            v = out["variants"][name]["median"]
            print(f"{name}: median {fmt(v, 1)} against {fmt(base, 1)} as tuned "
                  f"(ratio {v / base:.3f})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
