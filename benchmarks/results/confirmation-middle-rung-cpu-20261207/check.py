#!/usr/bin/env python3
"""The confirmation's middle rung on the real CPU engine: a fresh server of the
engine defaults (the embedded tiny model), the fast capacity search, then the
confirmation's probe at 1.5x its answer with a fallback at 0.4x and
``refine``: the load fails, the fallback holds, and the middle rung is probed."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from _common import launch, set_server_nice  # noqa: E402

from qtune.bench import BenchConfig  # noqa: E402
from qtune.capacity import CapacityPlan, find_capacity  # noqa: E402
from qtune.engines.vllm import VLLM  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.objectives import parse_slo  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="qtune-mid-"))
server, spec, tok = launch(None, {}, work)
with server:
    set_server_nice(server.proc.pid, 10)
    server.wait_ready(900)
    wl = Workload(input_len=128, output_len=128, rate=2, requests=20, warmup_requests=8,
                  seed=11)
    eng = VLLM()
    cfg = BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model,
                      tokenizer=Path(tok), slo=parse_slo("e2e_p50<=3000ms"),
                      capacity_window=20.0, capacity_tolerance=0.1,
                      metric_names=eng.metric_names(), reset_paths=eng.cache_reset_paths(),
                      gauge_interval=None)
    t0 = time.monotonic()
    first = find_capacity(spec.base_url, spec.served_model, cfg).to_dict()
    c = float(first["value"])
    print("search:", c, first["bracket"], first["probes"], "probes",
          round(time.monotonic() - t0), "s", flush=True)
    x, fb = round(1.5 * c, 1), round(0.4 * c, 1)
    plan = CapacityPlan(start=x, floor=x, window_s=first.get("window_s"), confirm=True,
                        fallback=fb, refine=True)
    t0 = time.monotonic()
    d = find_capacity(spec.base_url, spec.served_model, cfg, plan=plan).to_dict()
    print(json.dumps({"wall_s": round(time.monotonic() - t0), "value": d.get("value"),
                      "bracket": d.get("bracket"), "decided": d.get("decided"),
                      "reason": d.get("reason"),
                      "steps": [(s["load"], s["ok"], s["requests"], round(s["elapsed_s"]),
                                 s.get("prefix_cache_hit_rate"), s["why"][:70])
                                for s in d["steps"]]}, indent=1), flush=True)
