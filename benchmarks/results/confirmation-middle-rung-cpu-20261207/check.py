"""The confirmation's middle rung on the real CPU engine: a fresh server of the
defaults (the tiny random-weight model), asked to hold 60 req/s (far above its
~36-38), falling back to 24, then refined halfway (42)."""
import sys, tempfile, time, json
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
from _common import launch, set_server_nice
from qtune.bench import BenchConfig
from qtune.capacity import CapacityPlan, find_capacity
from qtune.engines.vllm import VLLM
from qtune.load.workload import Workload
from qtune.objectives import parse_slo

work = Path(tempfile.mkdtemp(prefix="qtune-mid-"))
server, spec, tok = launch(None, {}, work)
with server:
    set_server_nice(server.proc.pid, 10)
    server.wait_ready(900)
    wl = Workload(input_len=128, output_len=128, rate=2, requests=20, warmup_requests=8, seed=11)
    eng = VLLM()
    cfg = BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model, tokenizer=Path(tok),
                      slo=parse_slo("e2e_p50<=3000ms"), capacity_window=20.0, capacity_tolerance=0.1,
                      metric_names=eng.metric_names(), reset_paths=eng.cache_reset_paths(), gauge_interval=None)
    t0 = time.monotonic()
    first = find_capacity(spec.base_url, spec.served_model, cfg).to_dict()
    c = float(first["value"])
    print("search:", c, first["bracket"], first["probes"], "probes", round(time.monotonic() - t0), "s", flush=True)
    x, fb = round(1.5 * c, 1), round(0.4 * c, 1)
    for deadline in (None,):
        plan = CapacityPlan(start=x, floor=x, window_s=first.get("window_s"), confirm=True, fallback=fb,
                            refine=True, deadline=deadline)
        t0 = time.monotonic()
        cap = find_capacity(spec.base_url, spec.served_model, cfg, plan=plan)
        d = cap.to_dict()
        print(json.dumps({"deadline_past": deadline is not None, "wall_s": round(time.monotonic() - t0),
                          "value": d.get("value"), "bracket": d.get("bracket"), "decided": d.get("decided"),
                          "reason": d.get("reason"),
                          "steps": [(s["load"], s["ok"], s["requests"], round(s["elapsed_s"]), s.get("prefix_cache_hit_rate"), s["why"][:70]) for s in d["steps"]]}, indent=1), flush=True)
