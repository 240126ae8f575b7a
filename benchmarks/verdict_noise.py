#!/usr/bin/env python3
"""How often one load holds when it is probed again and again on one server: the
noise a capacity bracket has to live with (issue 27's fast-vs-full check).

One server for ``--params``; then ``--repeats`` rounds, each probing every load of
``--loads`` once (interleaved, so a drift of the server shows as a drift, not as a
difference between loads), with qtune's capacity probe (fresh prompts, the probe
window, the early stop of a certain failure).  Prints each probe and, per load, how
many held, with a Wilson 90% interval of the share.

``--arrivals alternate``: at every load each round runs two probes, one with
the send times of every other such probe (one arrival seed per load) and one
with send times of its own (the prompts are fresh in both), their order
alternated between rounds; per load it prints the spread of each SLO metric
in either group and their variance ratio.  Where one window's verdict differs
from the next's because its bursts differ, shared send times take that
spread away; where it comes from the server's own state, they do not.

    python benchmarks/verdict_noise.py \\
        --params '{"max_num_seqs": 8, "VLLM_CPU_KVCACHE_SPACE": 4}' \\
        --loads 3,4,5 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import launch, wait_until_alone  # noqa: E402

from qtune.bench import BenchConfig, measure  # noqa: E402
from qtune.capacity import FAST, FULL, CapacityPlan, _Search  # noqa: E402
from qtune.engines.vllm import VLLM  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.metrics import metric_value  # noqa: E402
from qtune.objectives import parse_slo  # noqa: E402


def wilson(k: int, n: int, z: float = 1.645) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--params", default="{}", help="JSON launch params ({} = defaults)")
    ap.add_argument("--loads", default="4", help="comma-separated request rates")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--slo", default="e2e_p99<=3000ms")
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--arrivals", choices=("fresh", "same", "alternate"), default="fresh",
                    help="send times: each probe its own (fresh), one pattern per "
                         "load (same), or both in turn (alternate)")
    ap.add_argument("--whole", action="store_true",
                    help="no early stop of a certain failure: every probe runs its "
                         "whole window, so every one gives the metrics' spread")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    wait_until_alone()
    server, spec, tok = launch(a.model, json.loads(a.params),
                               Path(tempfile.mkdtemp(prefix="qtune-noise-")))
    rows: list[dict[str, object]] = []
    with server:
        server.wait_ready(900)
        eng = VLLM()
        wl = Workload(input_len=a.input_len, output_len=a.output_len, rate=loads[0],
                      requests=a.requests, warmup_requests=a.warmup, seed=4242)
        cfg = BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model,
                          tokenizer=Path(tok), slo=parse_slo(a.slo),
                          capacity_window=a.window, metric_names=eng.metric_names(),
                          reset_paths=eng.cache_reset_paths(), gauge_interval=None)
        search = _Search(spec.base_url, spec.served_model, cfg,
                         CapacityPlan(start=loads[0], procedure=FULL if a.whole else FAST),
                         None, measure)
        t0 = time.monotonic()
        slos = [m.metric for m in cfg.slo]
        for r in range(a.repeats):
            for x in loads:
                modes = {"fresh": ["fresh"], "same": ["same"],
                         "alternate": ["same", "fresh"] if r % 2 else ["fresh", "same"]}
                for mode in modes[a.arrivals]:
                    # one arrival seed per load, or the probe's own (its prompt
                    # seed's); the prompts are the probe's own either way
                    arrivals = 777_000 + int(x * 1000) if mode == "same" else None
                    search.cfg = dataclasses.replace(
                        cfg, workload=dataclasses.replace(wl, _arrival_seed=arrivals))
                    held = search.probe(x, again=True)  # one verdict per probe: no re-run
                    p = search.b.probes[-1]
                    s = p.summary
                    row = {"round": r, "load": x, "arrivals": mode, "held": held,
                           "why": p.why, "t_s": round(time.monotonic() - t0, 1),
                           "requests_done": s.get("completed"),
                           "stopped_early": s.get("stopped_early"),
                           "e2e_p99_ms": metric_value(s, "e2e_p99"),
                           **{f"{m}_ms": metric_value(s, m) for m in slos}}
                    rows.append(row)
                    print(f"{row['t_s']:7.0f} s  round {r}  load {x:g}  {mode:5s}  "
                          f"{'held' if held else 'failed'}  "
                          + "  ".join(f"{m} {row[f'{m}_ms'] or float('nan'):.1f}"
                                      for m in slos)
                          + f"  {p.why[:70]}", flush=True)
    print()
    if a.arrivals == "alternate":
        for x in loads:
            for m in slos:
                # only whole windows: an early stop cut the tail the metric reads
                groups = {mode: [float(row[f"{m}_ms"]) for row in rows  # type: ignore[arg-type]
                                 if row["load"] == x and row["arrivals"] == mode
                                 and row[f"{m}_ms"] is not None and not row["stopped_early"]]
                          for mode in ("same", "fresh")}
                sd = {k: statistics.stdev(v) if len(v) > 1 else float("nan")
                      for k, v in groups.items()}
                ratio = (sd["fresh"] / sd["same"]) ** 2 if sd["same"] else float("inf")
                print(f"load {x:g} {m}: same arrivals sd {sd['same']:.2f} ms over "
                      f"{len(groups['same'])} ({', '.join(f'{v:.1f}' for v in groups['same'])}); "
                      f"fresh sd {sd['fresh']:.2f} ms over {len(groups['fresh'])} "
                      f"({', '.join(f'{v:.1f}' for v in groups['fresh'])}); "
                      f"variance fresh/same {ratio:.2f}")
    for x in loads:
        k = sum(1 for row in rows if row["load"] == x and row["held"])
        n = sum(1 for row in rows if row["load"] == x)
        lo, hi = wilson(k, n)
        print(f"load {x:g}: held {k} of {n} ({k / n:.0%}; 90% interval {lo:.0%}-{hi:.0%})")
    if a.json:
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)},
                                      "probes": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
