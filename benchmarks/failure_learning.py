#!/usr/bin/env python3
"""Do failed launches teach the sampler?  TPE against random search.

Issue 4 asks that start-up failures be recorded so the sampler avoids their
region, and that a run show fewer launches failing as the study goes on.  By
default qtune's memory estimate refuses a config that cannot fit before any
launch, so to see the *sampler* learn, this script turns the estimate off
(``--no-memory-check``) and lets vLLM itself refuse at start.

Setup: the embedded tiny model on the vLLM CPU build, a short closed-loop
load (the measurement is not what is judged here), and a two-parameter space:

- ``VLLM_CPU_KVCACHE_SPACE`` 1..``--kv-high`` GiB (linear).  vLLM refuses to
  start when the KV space exceeds the NUMA node's free memory, so on a
  24 GiB host roughly the upper half of the range fails at start (``oom``);
- ``max_num_seqs`` 4..32 (log), which every start accepts.

Everything else is fixed.  Each method runs ``--trials`` launches per seed
(the first is the engine-defaults baseline, which always starts).  Printed:
every run's launch sequence (``L`` started, ``F`` failed at start), and per
method the failed share of launches in the start-up design (the first
``startup`` tuned launches: Latin hypercube for TPE, random for random) and
after it, and how many proposals qtune refused without a launch because an
earlier start had failed asking for less (``learned_oom``).  A sampler that
learns shows a lower failed share after the start-up design than random's,
whose share stays at the failing fraction of the range unless qtune's
learned refusal stops it.

    python benchmarks/failure_learning.py              # ~30 min on 2 idle cores
    python benchmarks/failure_learning.py --seeds 1 --trials 6   # smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import wait_until_alone  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(method: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    space = work / "space.yaml"
    space.write_text(
        "# written by benchmarks/failure_learning.py\n"
        f"VLLM_CPU_KVCACHE_SPACE: {{low: 1, high: {args.kv_high}}}\n"
        "max_num_seqs: {low: 4, high: 32, log: true}\n"
        "max_num_batched_tokens: 2048\n"
        "enable_chunked_prefill: true\n"
        "enable_prefix_caching: false\n"
    )
    study = f"fail-{method}-s{seed}"
    cmd = [sys.executable, "-m", "qtune", "search", "--sampler", method,
           "--seed", str(seed), "--trials", str(args.trials), "--no-memory-check",
           "--space", str(space), "--concurrency", "8", "--input-len", "64",
           "--output-len", "16", "--requests", "40", "--warmup", "4",
           "--objective", "e2e_p50", "--confirm-top", "0", "--study", study,
           "--storage", f"journal:///{work}/{study}.log",
           "--out", str(work / f"{study}.yaml"), "--json"]
    wait_until_alone()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    wall = time.monotonic() - t0
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return {"method": method, "seed": seed, "error": proc.stderr.strip()[-300:],
                "wall_s": wall}
    seq = []
    learned = sum(t["reason"] == "learned_oom" for t in data["trials"])
    for t in data["trials"]:
        if t["baseline"] or t["status"] == "invalid":  # refused, never launched
            continue
        failed = t["status"] == "startup_failed"
        seq.append({"kv": t["params"].get("VLLM_CPU_KVCACHE_SPACE"),
                    "failed": failed, "reason": t["reason"] if failed else None})
    return {"method": method, "seed": seed, "launches": seq, "wall_s": wall,
            "learned_refusals": learned}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=10,
                    help="launches per run, the baseline included")
    ap.add_argument("--kv-high", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None, help="write the runs as JSON")
    args = ap.parse_args()
    from qtune.search.space import startup_trials

    startup = startup_trials(args.trials)
    runs = []
    with tempfile.TemporaryDirectory(prefix="qtune-failbench-") as tmp:
        for seed in range(args.seeds):
            for method in ("tpe", "random"):
                r = run(method, seed, args, Path(tmp))
                runs.append(r)
                if "error" in r:
                    print(f"{method} seed {seed}: FAILED RUN: {r['error']}", flush=True)
                    continue
                s = "".join("F" if x["failed"] else "L" for x in r["launches"])
                kv = " ".join(str(x["kv"]) for x in r["launches"])
                print(f"{method:6s} seed {seed}: {s:12s} KV GiB: {kv}  "
                      f"({r['wall_s'] / 60:.1f} min; {r['learned_refusals']} refused "
                      "as learned_oom)", flush=True)
    print(f"\nfailed at start, share of tuned launches (start-up design = first "
          f"{startup} tuned launches; {args.seeds} seeds):")
    for method in ("tpe", "random"):
        ok = [r for r in runs if r["method"] == method and "error" not in r]
        early = [x["failed"] for r in ok for x in r["launches"][:startup]]
        late = [x["failed"] for r in ok for x in r["launches"][startup:]]

        def share(v: list[bool]) -> str:
            return f"{sum(v)}/{len(v)} = {sum(v) / len(v):.0%}" if v else "n/a"

        print(f"  {method:6s} start-up design {share(early):14s} after it {share(late)}")
    fails = [x for r in runs if "error" not in r for x in r["launches"] if x["failed"]]
    if fails:
        lowest = min(x["kv"] for x in fails)
        print(f"  failures' reasons: {sorted({x['reason'] for x in fails})}; "
              f"smallest failing KV {lowest} GiB")
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
