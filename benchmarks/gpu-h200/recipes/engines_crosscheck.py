#!/usr/bin/env python3
"""Each engine's best trial of a ``qtune search --engine vllm,sglang --objective
capacity`` study, measured again by that engine's own benchmark client (issue 16,
item 4).  For each engine, in turn and alone on the GPU:

1. a fresh start of the exact command the study ran (its argv and env, from the
   journal), ready when ``/v1/models`` answers;
2. the engine's client at the capacity qtune reported, over as many requests as
   qtune's deciding re-measure (the run that made that rate the capacity), after a
   warm-up: vLLM's ``vllm bench serve`` (random dataset) or SGLang's
   ``sglang.benchmark.serving`` (random-ids), both with fixed lengths and EOS
   ignored, seeds no probe used;
3. the server's own prefix-cache counters read before and after (vLLM's
   ``prefix_cache_hits/queries``, SGLang's ``cached_tokens/prompt_tokens``): the
   client's prompts must not hit a cache the probes never had.

Prints the engine client's figures beside qtune's re-measure and writes them as JSON.
With ``--which winner,defaults`` (issue 27), instead of each engine's best: the winner of
the profile given and the engine defaults' trial, the winner first.  ``--at confirmed``:
each at the lowest load it held on its fresh starts in the study's confirmation (the
profile's ``confirmation``), not the search's capacity; ``--scale 2``: over twice the
search probe's window of arrivals at that rate (issue 27: "twice the window").

    python engines_crosscheck.py /tmp/qt/eng.log --slo ttft_p99=1000,tpot_p99=30 \\
        --input-len 1024 --output-len 256 --json /tmp/qt/crosscheck.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[2])]  # benchmarks/, the repo (qtune)
from server_view_ab import vllm_bench_serve  # noqa: E402

from qtune.engines import ENGINES, find_engines, on_this_host  # noqa: E402
from qtune.launch import LaunchSpec  # noqa: E402
from qtune.load.prometheus import parse  # noqa: E402
from qtune.server import Server  # noqa: E402

STUB = HERE / "sglang_client_stub"  # SGLang's client imports HF datasets, never calls it
# (hits, queries) as qtune.load.prometheus.parse names them ("_total" stripped)
COUNTERS = {"vllm": ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
            "sglang": ("sglang:cached_tokens", "sglang:prompt_tokens")}


def _study(journal: str) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(journal))
    return optuna.load_study(study_name=optuna.get_all_study_names(storage)[0],
                             storage=storage)


def engine_of(t: optuna.trial.FrozenTrial) -> str | None:
    """A trial's engine: a study of one engine marks none, its command says it."""
    argv = t.user_attrs.get("argv") or []
    return t.user_attrs.get("engine") or next(
        (e for e in COUNTERS if any(x.startswith(e + ".") for x in argv[1:3])), None)


def best_trials(journal: str) -> dict[str, optuna.trial.FrozenTrial]:
    """Each engine's completed trial with the highest capacity."""
    best: dict[str, optuna.trial.FrozenTrial] = {}
    for t in _study(journal).trials:
        eng = engine_of(t)
        if t.state != optuna.trial.TrialState.COMPLETE or t.value is None or not eng:
            continue
        if eng not in best or t.value > (best[eng].value or 0.0):
            best[eng] = t
    return best


def targets(journal: str, which: str,
            profile: Path | None) -> list[tuple[str, optuna.trial.FrozenTrial]]:
    """(label, trial) to cross-check, in order: each engine's best, the higher
    capacity first; or the profile's winner, then the engine defaults."""
    if which == "engines":
        return sorted(best_trials(journal).items(), key=lambda kv: -(kv[1].value or 0.0))
    import yaml

    trials = _study(journal).trials
    won = int(yaml.safe_load(profile.read_text())["study"]["trial"]) if profile else None
    base = next((t for t in trials if t.user_attrs.get("baseline")
                 and t.state == optuna.trial.TrialState.COMPLETE), None)
    out = [("winner", t) for t in trials if t.number == won]
    if base is not None and base.number != won:
        out.append(("defaults", base))
    return out


def confirmation(profile: Path | None) -> dict[str, Any]:
    """The profile's confirmation by trial number (``metrics.confirmation``):
    per fresh start, the load it held (``held``)."""
    if profile is None:
        return {}
    import yaml

    doc = yaml.safe_load(profile.read_text()) or {}
    return dict((doc.get("metrics") or {}).get("confirmation") or {})


def counters(url: str, names: tuple[str, str]) -> tuple[float, float] | None:
    """The sums of the two counters over their label sets, or None."""
    try:
        snap = parse(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
    except OSError:
        return None
    hits, queries = (sum(snap.get(n, {}).values()) for n in names)
    return hits, queries


def sglang_client(python: str, url: str, model: str, tok: str, input_len: int,
                  output_len: int, rate: float, n: int, seed: int, jsonl: Path, txt: Path,
                  warmup: int = 1, pythonpath: str = "") -> dict[str, Any]:
    """SGLang's ``sglang.benchmark.serving`` on its random-ids dataset (fixed lengths,
    EOS ignored, its default), its console output in ``txt``; its saved result.
    ``warmup`` 1 is the client's own default; ``pythonpath`` goes before the stub."""
    cmd = [python, "-m", "sglang.benchmark.serving", "--backend", "sglang-oai",
           "--base-url", url, "--model", model, "--tokenizer", tok,
           "--dataset-name", "random-ids", "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--random-range-ratio", "1.0",
           "--num-prompts", str(n), "--request-rate", str(rate), "--seed", str(seed),
           "--warmup-requests", str(warmup), "--output-file", str(jsonl)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(STUB)) if p)}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    txt.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"SGLang's client failed: {r.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(jsonl.read_text().splitlines()[-1])
    return result


def sglang_bench(python: str, url: str, model: str, tok: str, a: argparse.Namespace,
                 rate: float, n: int, seed: int, work: Path) -> dict[str, Any]:
    d = sglang_client(python, url, model, tok, a.input_len, a.output_len, rate, n, seed,
                      work / f"sglang-{seed}.jsonl", work / f"sglang-{seed}.txt", a.warmup)
    return {"completed": d["completed"], "failed": n - d["completed"],
            "req_s": d["request_throughput"], "duration_s": d["duration"],
            "prompt_tokens": d["total_input_tokens"],
            **{f"{m}_{p}": d[f"{'median' if p == 'p50' else p}_{k}_ms"]
               for m, k in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e_latency"))
               for p in ("p50", "p99")}}


def vllm_bench(python: str, url: str, model: str, tok: str, a: argparse.Namespace,
               rate: float, n: int, seed: int, work: Path) -> dict[str, Any]:
    d = vllm_bench_serve(python, url, model, tok, a.input_len, a.output_len, rate, n,
                         a.warmup, seed, work)
    return {"completed": d["completed"], "failed": d.get("failed", 0),
            "req_s": d["request_throughput"], "duration_s": d["duration"],
            "prompt_tokens": d.get("total_input_tokens"),
            **{f"{m}_{p}": d.get(f"{p if p != 'p50' else 'median'}_{k}_ms")
               for m, k in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2el"))
               for p in ("p50", "p99")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("journal")
    ap.add_argument("--slo", default="ttft_p99=1000,tpot_p99=30",
                    help="metric=ms limits, comma-separated")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=160)
    ap.add_argument("--engines", default="", help="only these (comma-separated)")
    ap.add_argument("--which", default="engines", choices=("engines", "winner,defaults"),
                    help="each engine's best, or the profile's winner and the defaults")
    ap.add_argument("--profile", type=Path, default=None,
                    help="with --which winner,defaults: the profile naming the winner")
    ap.add_argument("--at", default="search", choices=("search", "confirmed"),
                    help="the search's capacity, or what the confirmation's fresh starts held")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="windows of arrivals: the deciding probe's requests times this")
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    if a.at == "confirmed" and a.profile is None:
        ap.error("--at confirmed reads the confirmation from --profile")
    confirmed = confirmation(a.profile) if a.at == "confirmed" else {}
    slo = {k: float(v) for k, v in (x.split("=") for x in a.slo.split(","))}
    work = a.json.parent
    done: dict[str, Any] = json.loads(a.json.read_text()) if a.json.exists() else {}
    # the study's answer first: it is checked even if time runs out
    for seed, (label, t) in enumerate(targets(a.journal, a.which, a.profile), start=7001):
        eng = engine_of(t) or "vllm"
        if (a.engines and eng not in a.engines.split(",")) or label in done:
            continue
        summary = t.user_attrs.get("summary") or {}
        cap = summary.get("capacity") or {}
        steps = cap.get("steps") or []
        held = [s for s in steps if s["ok"] and s["load"] == cap.get("value")]
        if not cap.get("found") or not held:
            print(f"{label}: trial {t.number} has no capacity to cross-check", flush=True)
            continue
        rate, n = float(cap["value"]), int(held[-1]["requests"])
        at = "search"
        fresh = [v for v in (confirmed.get(str(t.number)) or {}).get("held") or []
                 if v is not None]
        if fresh:
            at, rate = "confirmed", float(min(fresh))
        if cap.get("window_s") and at == "confirmed":
            # a probe's rule: the window's arrivals at this rate (the
            # search's request count was for its own rate)
            n = math.ceil(rate * float(cap["window_s"]))
        n = math.ceil(n * a.scale)
        argv, env = list(t.user_attrs["argv"]), dict(t.user_attrs.get("env") or {})
        name = argv[argv.index("--served-model-name") + 1]
        tok = argv[argv.index("--tokenizer-path" if "--tokenizer-path" in argv
                              else "--tokenizer") + 1]
        # the exact command the study ran, under qtune's guard (stopped with this
        # script; the guard's `python -m qtune.guard` finds qtune from the repo, the cwd)
        spec = LaunchSpec(argv=tuple(argv), env=env, host="127.0.0.1",
                          port=int(argv[argv.index("--port") + 1]), served_model=name)
        # the compile caches the study's starts used (run 16 started without
        # them: torch.compile 40 s, a miss, against 7 s for the confirmation)
        install = find_engines(argv[0]).get(eng)
        if install is not None:
            spec = on_this_host(ENGINES[eng], spec, install)
        with Server(spec, work / f"x-{label}-server.log") as srv:
            ready = srv.wait_ready(900)
            url = spec.base_url
            print(f"{label}: trial {t.number} ready after {ready:.0f} s; "
                  f"its client at {rate:g} req/s ({at}), {n} requests", flush=True)
            before = counters(url, COUNTERS[eng])
            bench = vllm_bench if eng == "vllm" else sglang_bench
            r = bench(argv[0], url, name, tok, a, rate, n, seed, work)
            after = counters(url, COUNTERS[eng])
        hit = None
        if before and after and after[1] > before[1]:
            # includes the warm-up's: a repeated warm-up prompt hits on purpose
            hit = (after[0] - before[0]) / (after[1] - before[1])
        r["prefix_cache_hit_rate_incl_warmup"] = hit
        r["slo_held"] = all((r.get(k) or 0) <= v for k, v in slo.items()) and r["failed"] == 0
        r["served_share"] = r["req_s"] / rate
        qt = {k: held[-1].get(k) for k in ("ttft_p99", "tpot_p99", "e2e_p99", "throughput",
                                            "requests", "prefix_cache_hit_rate")}
        done[label] = {"engine": eng, "trial": t.number, "at": at, "scale": a.scale,
                       "search_capacity": float(cap["value"]),
                       "baseline": bool(t.user_attrs.get("baseline")),
                       "params": t.user_attrs.get("launch_params"), "capacity": rate,
                       "requests": n, "startup_s": ready, "engine_client": r, "qtune": qt}
        a.json.write_text(json.dumps(done, indent=2))
        print(f"{label}: engine client {r['req_s']:.2f} req/s, TTFT p99 {r['ttft_p99']:.0f} ms, "
              f"TPOT p99 {r['tpot_p99']:.1f} ms, E2E p99 {r['e2e_p99']:.0f} ms, "
              f"failed {r['failed']}, prompt tokens/req "
              f"{(r['prompt_tokens'] or 0) / max(1, r['completed']):.0f}, "
              f"SLO {'held' if r['slo_held'] else 'BROKEN'}; qtune's re-measure {qt}", flush=True)
        time.sleep(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
