#!/usr/bin/env python3
"""Does the capacity qtune reports hold when vLLM's own client measures it?

Starts one server (the engine defaults, or ``--params`` as JSON) for
``--model``, then:

1. ``qtune bench --find-capacity`` on it, as a user runs it, with ``--slo``;
   every probe reports its prefix-cache hit rate from the server's counters;
2. at the capacity qtune reported, ``vllm bench serve`` (random prompts, a
   seed no probe used) over twice the longest probe's request count, after a
   warm-up, and ``qtune bench`` over the same count with fresh prompts too;
3. prints whether each met the SLO at that rate and kept up (served rate
   against offered), and the two clients side by side.

    python benchmarks/capacity_crosscheck.py                       # CPU, tiny model
    python benchmarks/capacity_crosscheck.py --model examples/qwen3-4b \\
        --input-len 1024 --output-len 256 --rate 16 \\
        --slo 'ttft_p99<=1000ms,tpot_p99<=30ms'                    # one H200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import launch  # noqa: E402
from server_view_ab import vllm_bench_serve  # noqa: E402


def qtune_bench(url: str, model: str, tok: str, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "qtune", "bench", "--url", url, "--model", model,
           "--tokenizer", tok, "--json", "--reset-prefix-cache", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    sys.stderr.write(r.stderr[-1500:])
    if r.returncode not in (0, 3):
        raise SystemExit(f"qtune bench failed ({r.returncode})")
    return json.loads(r.stdout)


def vllm_bench(a: argparse.Namespace, url: str, model: str, tok: str, rate: float,
               n: int, seed: int, work: Path) -> dict[str, Any]:
    return vllm_bench_serve(sys.executable, url, model, tok, a.input_len, a.output_len,
                            rate, n, a.warmup, seed, work)


def reset_cache(url: str) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(url + "/reset_prefix_cache",
                                                      method="POST"), timeout=30).read()
    except OSError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: embedded)")
    ap.add_argument("--params", default="{}", help="launch params as JSON (default: "
                    "the engine defaults)")
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--rate", type=float, default=4.0, help="first probe's rate")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--slo", default="ttft_p99<=300ms,tpot_p99<=100ms")
    ap.add_argument("--capacity-window", type=float, default=20.0)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--url", help="measure this running server (start none); needs "
                    "--served-model and --tokenizer")
    ap.add_argument("--served-model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--at", type=float, help="skip the capacity search: cross-check "
                    "this rate (a capacity a study reported), over --at-requests")
    ap.add_argument("--at-requests", type=int, default=0,
                    help="with --at: requests per client (twice the study's longest probe)")
    ap.add_argument("--client-windows", type=float, default=None,
                    help="vLLM's client over this many probe windows of arrivals at the "
                    "capacity (issue 27: 2); default: twice the longest probe's requests")
    ap.add_argument("--no-qtune", action="store_true",
                    help="skip qtune's own run over the same requests (device time)")
    a = ap.parse_args()
    if a.at is not None and a.at_requests <= 0:
        ap.error("--at needs --at-requests > 0")

    work = Path(tempfile.mkdtemp(prefix="qtune-capacity-"))
    out: dict[str, Any] = {"params": json.loads(a.params)}
    t0 = time.monotonic()
    if a.url:  # a server already up (benchmarks/serve.py): no start here
        srv_cm: Any = contextlib.nullcontext()
        url, model, tok = a.url, a.served_model, a.tokenizer
    else:
        srv_cm, spec, tok = launch(a.model, out["params"], work)
        url, model = spec.base_url, spec.served_model
        out["argv"] = list(spec.argv)
        print(f"server: {' '.join(spec.argv[3:])}  env {dict(spec.env)}", flush=True)
    with srv_cm as srv:
        if srv is not None:
            out["startup_s"] = srv.wait_ready(a.startup_timeout)
            print(f"ready after {out['startup_s']:.0f} s", flush=True)
        if a.at is not None:  # the capacity came from a study (its profile)
            rate, n = a.at, a.at_requests
            print(f"capacity {rate:g} req/s (given); cross-check over {n} requests with "
                  "fresh prompts", flush=True)
        else:
            cap = qtune_bench(url, model, tok, "--find-capacity", "--slo", a.slo,
                              "--rate", str(a.rate), "--requests", str(a.requests),
                              "--warmup", str(a.warmup), "--input-len", str(a.input_len),
                              "--output-len", str(a.output_len), "--capacity-window",
                              str(a.capacity_window))["capacity"]
            out["capacity"] = cap
            for st in cap["steps"]:
                print(f"  probe {st['load']:g} req/s: {'held' if st['ok'] else 'no'} "
                      f"({st['why']}); {st['requests']} requests, served "
                      f"{(st.get('served_share') or 0) * st['load']:.2f} req/s, prefix "
                      f"hits {st.get('prefix_cache_hit_rate')}", flush=True)
            if not cap.get("found"):
                print(f"no capacity: {cap.get('reason')}")
                return 1
            rate = cap["value"]
            n = 2 * max(st["requests"] for st in cap["steps"])
            if a.client_windows:
                n = math.ceil(a.client_windows * rate * (cap.get("window_s") or a.capacity_window))
            print(f"capacity {rate:g} req/s ({cap.get('decided')}); cross-check over {n} "
                  "requests with fresh prompts", flush=True)
        reset_cache(url)
        v = vllm_bench(a, url, model, tok, rate, n, 777, work)
        q = {} if a.no_qtune else qtune_bench(
            url, model, tok, "--rate", str(rate), "--requests", str(n),
            "--warmup", str(a.warmup), "--input-len", str(a.input_len),
            "--output-len", str(a.output_len), "--slo", a.slo, "--seed", "778")
    out["wall_s"] = time.monotonic() - t0
    slo = dict(x.split("<=") for x in a.slo.split(","))

    def ms(x: str) -> float:
        return float(x[:-2]) if x.endswith("ms") else float(x.rstrip("s")) * 1000

    rows = []
    for name, key_v, key_q in (("ttft_p99", "p99_ttft_ms", ("ttft_ms", "p99")),
                               ("tpot_p99", "p99_tpot_ms", ("tpot_ms", "p99")),
                               ("ttft_p50", "p50_ttft_ms", ("ttft_ms", "p50")),
                               ("tpot_p50", "p50_tpot_ms", ("tpot_ms", "p50")),
                               ("e2e_p99", "p99_e2el_ms", ("e2e_ms", "p99"))):
        vv, qq = v.get(key_v), (q.get(key_q[0]) or {}).get(key_q[1], math.nan)
        lim = ms(slo[name]) if name in slo else None
        rows.append((name, vv, qq, lim))
    print(f"\nat {rate:g} req/s, {n} requests each (vLLM's client, then qtune's):")
    print(f"  {'metric':10s} {'vllm':>10s} {'qtune':>10s} {'SLO':>8s}")
    for name, vv, qq, lim in rows:
        print(f"  {name:10s} {vv:10.1f} {qq:10.1f} {lim if lim else '-':>8}")
    print(f"  {'req/s':10s} {v['request_throughput']:10.2f} "
          f"{q.get('request_throughput', math.nan):10.2f}"
          f" {rate:>8g} offered")
    # Served: completions over the whole run, drain included, against what a
    # server that keeps up would give (n over the arrival window plus one
    # median request).
    kept_up = n / (n / rate + v["median_e2el_ms"] / 1000)
    held_v = all(vv <= lim for _, vv, _, lim in rows if lim) and \
        v["request_throughput"] >= 0.9 * kept_up
    held_q = "not run (--no-qtune)" if a.no_qtune else \
        f"SLO {'held' if (q.get('goodput') or {}).get('slo_met') else 'NOT held'}"
    print(f"vLLM's client: SLO {'held' if held_v else 'NOT held'} at qtune's capacity; "
          f"qtune bench: {held_q}"
          f"; prompt tokens per request (server) vLLM {v['total_input_tokens'] / n:.1f}")
    out.update(vllm=v, qtune=q, held_by_vllm=held_v)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
