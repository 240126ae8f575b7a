#!/usr/bin/env python3
"""How often one load holds when it is probed again and again on one server: the
noise a capacity bracket has to live with (issue 27's fast-vs-full check).

One server for ``--params``; then ``--repeats`` rounds, each probing every load of
``--loads`` once (interleaved, so a drift of the server shows as a drift, not as a
difference between loads), with qtune's capacity probe (fresh prompts, the probe
window, the early stop of a certain failure).  Prints each probe and, per load, how
many held, with a Wilson 90% interval of the share.

    python benchmarks/verdict_noise.py \\
        --params '{"max_num_seqs": 8, "VLLM_CPU_KVCACHE_SPACE": 4}' \\
        --loads 3,4,5 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import launch, wait_until_alone  # noqa: E402

from qtune.bench import BenchConfig, measure  # noqa: E402
from qtune.capacity import FAST, CapacityPlan, _Search  # noqa: E402
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
                         CapacityPlan(start=loads[0], procedure=FAST), None, measure)
        t0 = time.monotonic()
        for r in range(a.repeats):
            for x in loads:
                held = search.probe(x, again=True)  # one verdict per probe: no re-run
                p = search.b.probes[-1]
                s = p.summary
                row = {"round": r, "load": x, "held": held, "why": p.why,
                       "t_s": round(time.monotonic() - t0, 1),
                       "requests_done": s.get("completed"),
                       "stopped_early": s.get("stopped_early"),
                       "e2e_p99_ms": metric_value(s, "e2e_p99")}
                rows.append(row)
                print(f"{row['t_s']:7.0f} s  round {r}  load {x:g}  "
                      f"{'held' if held else 'failed'}  {p.why[:90]}", flush=True)
    print()
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
