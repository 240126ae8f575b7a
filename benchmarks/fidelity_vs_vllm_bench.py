#!/usr/bin/env python3
"""Fidelity: qtune's load client against ``vllm bench serve`` on one server.

Starts ONE real vLLM CPU server (qtune's embedded tiny model, random
weights), builds ONE fixed prompt set with qtune's ``PromptFactory`` and
sends the same prompts, at the same Poisson rate and count, through

  A  qtune's client        (``qtune.load.run_load`` + ``qtune.metrics.summarize``)
  B  vLLM's client, either
       --vllm-client bench   (default) the real ``vllm bench serve``
                             (``vllm.benchmarks.serve.main``) reading the same
                             prompts from a ``custom`` JSONL dataset
                             (--skip-chat-template --disable-shuffle
                             --ignore-eos --temperature 0), or
       --vllm-client reqfunc vLLM's request function
                             (``async_request_openai_completions``) and metric
                             code (``calculate_metrics``), driven by qtune's
                             exact arrival schedule.

Why ``bench`` is the default: it is the tool people quote, so agreement
with it is what "fidelity" means.  It draws its own arrivals (numpy gamma,
rescaled so the last arrival is exactly N/rate) and times its duration from
before the first arrival gap to the last closed stream, so request
throughput can differ by schedule and definition, not by measurement.
``reqfunc`` removes both: same send times, so any remaining difference is
the clients' timing code.

Runs interleave A and B (ABAB...) to spread server drift.  Prefix caching is
off on the server (--no-enable-prefix-caching): the same prompts are sent in
every run, and a cached prefix would make every run after the first cheaper.

Prints per-run figures as each tool reports them, then pooled p50/p99 of
TTFT, TPOT, ITL and E2E over all repeats (qtune through ``summarize``,
vLLM through its own ``calculate_metrics``), request throughput (mean of
runs), the ratio qtune/vllm and whether it lies within the 5% target.

    python benchmarks/fidelity_vs_vllm_bench.py            # ~4-5 min
    python benchmarks/fidelity_vs_vllm_bench.py --quick    # ~1.5 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    AGREEMENT,
    Monitor,
    fmt,
    ratio,
    table,
    verdict,
    wait_until_alone,
)

METRICS = ("ttft", "tpot", "itl", "e2e")
PCTS = (50, 99)


@dataclass
class Run:
    client: str  # "qtune" | "vllm"
    index: int
    reported: dict[str, float | None]  # as the tool itself reports it
    throughput: float  # tool's own request_throughput
    duration: float  # tool's own duration
    completed: int
    failed: int
    send_span: float  # first send -> last send
    chunks_per_token: float  # timed chunks / output tokens
    raw: Any = field(repr=False, default=None)  # samples / RequestFuncOutputs
    foreign_cpu: float = 0.0  # share of machine CPU used by others meanwhile
    tries: int = 1


# --------------------------------------------------------------------------- A
def run_qtune(base_url: str, model: str, tok: Path, a: argparse.Namespace, i: int) -> Run:
    from qtune.load import Workload, run_load
    from qtune.metrics import summarize

    wl = Workload(
        input_len=a.input_len, output_len=a.output_len, rate=a.rate,
        requests=a.requests, warmup_requests=0, seed=a.seed,
    )
    res = asyncio.run(run_load(base_url, model, wl, tokenizer=tok))
    s = summarize(res.samples, res.duration)
    ok = [x for x in res.samples if x.ok]
    starts = [x.start for x in res.samples]
    rep = {}
    for m in METRICS:
        for p in PCTS:
            rep[f"{m}_p{p}"] = (s[f"{m}_ms"] or {}).get(f"p{p}")
    return Run(
        "qtune", i, rep, s["request_throughput"], res.duration,
        s["completed"], s["failed"], max(starts) - min(starts),
        sum(len(x.itl) + 1 for x in ok) / max(1, sum(x.output_tokens for x in ok)),
        res.samples,
    )


def fit_rate(base_url: str, model: str, tok: Path, a: argparse.Namespace) -> float:
    """The rate at which requests served one at a time would overlap about
    once on average (Little: in flight = rate x e2e), capped at --rate.

    A CI host without AVX-512 served TPOT p50 of 112 and 213 ms to the two
    clients at 4 req/s (about 30x this VM's): overloaded, the medians
    measure the queue, not the clients."""
    from qtune import seeds
    from qtune.load import Workload, run_load

    wl = Workload(a.input_len, a.output_len, concurrency=1, requests=max(4, a.prewarm),
                  warmup_requests=0, seed=seeds.warmup(a.seed + 1))
    res = asyncio.run(run_load(base_url, model, wl, tokenizer=tok))
    e2e = [x.e2e for x in res.samples if x.ok and x.e2e]
    if not e2e:
        raise SystemExit("fidelity: no request of the rate fit completed")
    rate = min(a.rate, len(e2e) / sum(e2e))
    print(f"  rate fit: mean e2e {sum(e2e) / len(e2e) * 1e3:.0f} ms one at a time "
          f"-> {rate:.3g} req/s", flush=True)
    return rate


# --------------------------------------------------------------------------- B
def _vllm_run_from_outputs(outs: list, dur: float, i: int, thr: float | None = None) -> Run:
    from vllm.benchmarks.serve import calculate_metrics

    with contextlib.redirect_stdout(_SINK):
        met, _ = calculate_metrics(
            input_requests=[], outputs=outs, dur_s=dur, tokenizer=None,
            selected_percentiles=[float(p) for p in PCTS], goodput_config_dict={},
        )
    rep = {}
    for m, attr in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
        for p, v in getattr(met, f"percentiles_{attr}_ms"):
            rep[f"{m}_p{int(p)}"] = float(v)
    ok = [o for o in outs if o.success]
    starts = [o.start_time for o in outs]
    return Run(
        "vllm", i, rep, met.request_throughput if thr is None else thr, dur,
        met.completed, met.failed, max(starts) - min(starts),
        sum(len(o.itl) + 1 for o in ok) / max(1, sum(o.output_tokens for o in ok)),
        outs,
    )


def run_vllm_bench(base_url: str, model: str, tok: Path, jsonl: Path,
                   a: argparse.Namespace, i: int, log) -> Run:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", base_url,
        "--endpoint", "/v1/completions", "--model", model,
        "--tokenizer", str(tok),
        "--dataset-name", "custom", "--dataset-path", str(jsonl),
        "--custom-output-len", str(a.output_len),
        "--skip-chat-template", "--disable-shuffle",
        "--num-prompts", str(a.requests), "--request-rate", str(a.rate),
        "--seed", str(a.seed), "--ignore-eos", "--temperature", "0",
        "--num-warmups", "0", "--disable-tqdm", "--save-detailed",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", ",".join(str(p) for p in PCTS),
    ])
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        r = bench_main(args)
    gc.unfreeze()  # bench main() gc.freeze()s the heap; undo it for qtune's turn
    outs = []
    for k in range(len(r["ttfts"])):
        ok = not r["errors"][k] and r["output_lens"][k] > 0
        outs.append(RequestFuncOutput(
            success=ok, latency=r["latencies"][k], output_tokens=r["output_lens"][k],
            ttft=r["ttfts"][k], itl=list(r["itls"][k]), start_time=r["start_times"][k],
            error=r["errors"][k],
        ))
    run = _vllm_run_from_outputs(outs, r["duration"], i, r["request_throughput"])
    # Keep vLLM's own printed figures (they should equal the recomputation).
    for m, key in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
        for p in PCTS:
            v = r.get(f"p{p}_{key}_ms")
            if v is not None:
                if abs(v - (run.reported[f"{m}_p{p}"] or 0)) > 1e-6 * max(1, abs(v)):
                    print(f"  note: recomputed {m}_p{p} differs from vllm's "
                          f"{v:.4f}", flush=True)
                run.reported[f"{m}_p{p}"] = float(v)
    return run


def run_vllm_reqfunc(base_url: str, model: str, prompts: list[tuple[str, int]],
                     a: argparse.Namespace, i: int) -> Run:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    async def go():
        connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=60)
        async with aiohttp.ClientSession(
            connector=connector, trust_env=True,
            timeout=aiohttp.ClientTimeout(total=6 * 3600),
        ) as session:
            # qtune's own schedule (same seed, same draws, same rescaling to
            # N/rate), so both clients send at the same instants.
            from qtune.load import Workload, _normalised, inter_arrivals

            wl = Workload(rate=a.rate, requests=len(prompts))
            gap = _normalised(inter_arrivals(wl, random.Random(a.seed)), len(prompts),
                              a.rate)
            t0 = time.perf_counter()
            next_at = t0
            tasks = []
            for text, n in prompts:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                inp = RequestFuncInput(
                    prompt=text, api_url=base_url + "/v1/completions", prompt_len=n,
                    output_len=a.output_len, model=model, ignore_eos=True,
                    extra_body={"temperature": 0.0},
                )
                tasks.append(asyncio.create_task(
                    async_request_openai_completions(inp, session)))
                next_at += gap()
            outs = await asyncio.gather(*tasks)
            return outs, time.perf_counter() - t0

    outs, dur = asyncio.run(go())
    return _vllm_run_from_outputs(list(outs), dur, i)


def measured_prompts(tok: Path, a: argparse.Namespace) -> list[tuple[str, int]]:
    """The (prompt, tokens) sequence run_load sends in its measured phase."""
    from qtune.load import Workload

    wl = Workload(input_len=a.input_len, output_len=a.output_len, rate=a.rate,
                  requests=a.requests, warmup_requests=0, seed=a.seed)
    try:
        from qtune.load.prompts import RequestSource
    except ImportError:  # older qtune: prompts drawn straight from PromptFactory
        from qtune.load.prompts import PromptFactory

        pf = PromptFactory(tok, a.seed)
        return [pf.prompt(a.input_len) for _ in range(a.requests)]
    reqs = RequestSource(wl, tok, a.seed).take(a.requests)
    assert all(r.max_tokens == a.output_len for r in reqs)
    return [(r.prompt, r.prompt_tokens) for r in reqs]


# ----------------------------------------------------------------- pooling
def pooled(runs: list[Run]) -> dict[str, float | None]:
    """p50/p99 over all requests of all runs of one client, each tool's code."""
    out: dict[str, float | None] = {}
    if runs[0].client == "qtune":
        from qtune.metrics import summarize

        s = summarize([x for r in runs for x in r.raw], 1.0)
        for m in METRICS:
            for p in PCTS:
                out[f"{m}_p{p}"] = (s[f"{m}_ms"] or {}).get(f"p{p}")
    else:
        r = _vllm_run_from_outputs([o for r in runs for o in r.raw], 1.0, -1)
        out.update(r.reported)
    out["req_per_s"] = statistics.mean(r.throughput for r in runs)
    return out


def reset_prefix_cache(base_url: str) -> None:
    req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


class _Sink:
    def write(self, s):  # noqa: D401
        return len(s)

    def flush(self):
        pass


_SINK = _Sink()


# -------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson req/s (4)")
    ap.add_argument("--requests", type=int, default=200, help="per run (200)")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="runs per client (2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prewarm", type=int, default=16,
                    help="requests sent once after start, other prompts (16)")
    ap.add_argument("--vllm-client", choices=("bench", "reqfunc"), default="bench")
    ap.add_argument("--prefix-cache", choices=("off", "reset"), default="off",
                    help="off: --no-enable-prefix-caching; reset: keep it on and "
                    "POST /reset_prefix_cache before each run (dev mode)")
    ap.add_argument("--kv-space", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE GiB")
    ap.add_argument("--fit-rate", action="store_true",
                    help="lower --rate to what this host serves one request at a "
                    "time (1 / mean e2e of the prewarm, sent one by one), so the "
                    "server keeps up on a slow host; near saturation the two "
                    "clients' medians part whatever their definitions")
    ap.add_argument("--quick", action="store_true",
                    help="40 requests, 1 repeat each, 4 prewarm (about 1.5 min)")
    ap.add_argument("--max-tries", type=int, default=3,
                    help="repeat a run that another vLLM server disturbed (3)")
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="repeat a run when other processes used more than this "
                    "share of the machine's CPU meanwhile (0.10)")
    ap.add_argument("--quiet", type=float, default=15.0,
                    help="seconds without another vLLM server before a run (15)")
    ap.add_argument("--json", type=Path, help="write all figures here")
    ap.add_argument("--workdir", type=Path, help="keep logs/JSONL here")
    a = ap.parse_args(argv)
    if a.quick:
        a.requests, a.repeats, a.prewarm = 40, 1, 4
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    from qtune import seeds
    from qtune.engines import probe_host as probe
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.load import Workload, run_load
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    work = a.workdir or Path(tempfile.mkdtemp(prefix="qtune-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    m = resolve_model(None)
    tok = m.tokenizer_dir

    # One fixed prompt set, exactly the sequence qtune's run_load draws.
    prompts = measured_prompts(tok, a)
    jsonl = work / "prompts.jsonl"
    with jsonl.open("w") as f:
        for text, _ in prompts:
            f.write(json.dumps({"prompt": text, "output_tokens": a.output_len}) + "\n")
    bad = sum(1 for _, n in prompts if n != a.input_len)

    host = probe()
    ctx = SpaceContext(host, m, host.engines.get("vllm"))
    params: dict[str, Any] = {"VLLM_CPU_KVCACHE_SPACE": a.kv_space}
    if a.prefix_cache == "off":
        params["enable_prefix_caching"] = False
    else:
        params["VLLM_SERVER_DEV_MODE"] = 1
    spec = VLLM().launch_spec(params, ctx, host="127.0.0.1", port=free_port())

    print(f"fidelity: qtune client vs vLLM {a.vllm_client} client")
    print(f"  model {m.served_name} (random weights), {a.requests} prompts x "
          f"{a.input_len} tok (seed {a.seed}; {bad} off-length), output "
          f"{a.output_len} tok ignore_eos, Poisson {a.rate:g} req/s, "
          f"{a.repeats} repeats/client, order " + "AB" * a.repeats)
    print(f"  server: {' '.join(spec.argv[3:])}  env {dict(spec.env)}")
    print(f"  work dir {work}", flush=True)

    wait_until_alone(quiet=a.quiet)
    runs: list[Run] = []
    t_all = time.monotonic()
    bench_log = open(work / "vllm_bench.log", "w")  # noqa: SIM115
    with Server(spec, work / "server.log") as srv:
        ready = srv.wait_ready(600)
        print(f"  server ready after {ready:.0f} s", flush=True)
        own = {srv.proc.pid}
        import psutil
        own |= {p.pid for p in psutil.Process(srv.proc.pid).children(recursive=True)}
        if a.prewarm:
            wl = Workload(a.input_len, a.output_len, rate=a.rate,
                          requests=a.prewarm, warmup_requests=0,
                          seed=seeds.warmup(a.seed))
            asyncio.run(run_load(spec.base_url, spec.served_model, wl, tokenizer=tok))
        if a.fit_rate:
            a.rate = fit_rate(spec.base_url, spec.served_model, tok, a)
        for i in range(a.repeats):
            for client in ("qtune", "vllm"):
                for attempt in range(1, a.max_tries + 1):
                    wait_until_alone(own, quiet=a.quiet)
                    if a.prefix_cache == "reset":
                        reset_prefix_cache(spec.base_url)
                    t = time.monotonic()
                    with Monitor([srv.proc.pid]) as mon:
                        if client == "qtune":
                            r = run_qtune(spec.base_url, spec.served_model, tok, a, i)
                        elif a.vllm_client == "bench":
                            r = run_vllm_bench(spec.base_url, spec.served_model,
                                               tok, jsonl, a, i, bench_log)
                        else:
                            r = run_vllm_reqfunc(spec.base_url, spec.served_model,
                                                 prompts, a, i)
                    r.foreign_cpu, r.tries = mon.foreign_cpu, attempt
                    print(f"  run {len(runs) + 1}: {client:5s} "
                          f"{time.monotonic() - t:5.1f} s wall, {r.completed} ok / "
                          f"{r.failed} failed, TTFT p50 {fmt(r.reported['ttft_p50'])}"
                          f" ms, {r.throughput:.3f} req/s, foreign CPU "
                          f"{r.foreign_cpu:.0%}", flush=True)
                    why = []
                    if mon.intruders:
                        why.append(f"another vLLM server ran meanwhile "
                                   f"({sorted(mon.intruders)})")
                    if r.foreign_cpu > a.max_foreign:
                        why.append(f"foreign CPU {r.foreign_cpu:.0%} > "
                                   f"{a.max_foreign:.0%}")
                    if not why:
                        break
                    if mon.describe():
                        why.append("top others: " + mon.describe())
                    print("    " + "; ".join(why) + ": "
                          + ("repeating this run" if attempt < a.max_tries
                             else "kept, marked"), flush=True)
                runs.append(r)
    bench_log.close()
    total = time.monotonic() - t_all

    # ---------------------------------------------------------------- report
    q = [r for r in runs if r.client == "qtune"]
    v = [r for r in runs if r.client == "vllm"]
    print("\nPer run, as each tool reports it (ms; req/s; s):")
    keys = [f"{m}_p{p}" for m in METRICS for p in PCTS]
    hdr = ["run", "client"] + [k.replace("_", " ") for k in keys] + [
        "req/s", "duration", "send span", "chunks/tok", "ok", "fail",
        "foreign CPU"]
    rows = []
    for n, r in enumerate(runs, 1):
        rows.append([str(n), r.client] + [fmt(r.reported[k]) for k in keys] + [
            f"{r.throughput:.3f}", f"{r.duration:.2f}", f"{r.send_span:.2f}",
            f"{r.chunks_per_token:.4f}", str(r.completed), str(r.failed),
            f"{r.foreign_cpu:.0%}" + ("" if r.tries == 1 else f" (try {r.tries})")])
    print(table(hdr, rows))

    pq, pv = pooled(q), pooled(v)
    print(f"\nPooled over {len(q)} run(s) per client "
          f"({sum(r.completed for r in q)} vs {sum(r.completed for r in v)} requests); "
          f"target |qtune/vllm - 1| <= {AGREEMENT:.0%}:")
    rows = []
    verdicts = {}
    for k in keys + ["req_per_s"]:
        rr = ratio(pq[k], pv[k])
        verdicts[k] = verdict(rr)
        unit = "req/s" if k == "req_per_s" else "ms"
        rows.append([k.replace("_", " "), unit, fmt(pq[k], 3), fmt(pv[k], 3),
                     fmt(rr, 4), verdicts[k]])
    print(table(["metric", "unit", "qtune", "vllm", "qtune/vllm", "verdict"], rows))
    n_ok = sum(1 for x in verdicts.values() if x == "agree")
    print(f"\n{n_ok}/{len(verdicts)} metrics within {AGREEMENT:.0%}; "
          f"total {total:.0f} s (server start included)")

    if a.json:
        a.json.write_text(json.dumps({
            "config": {k: (str(x) if isinstance(x, Path) else x)
                       for k, x in vars(a).items()},
            "runs": [{k: getattr(r, k) for k in
                      ("client", "index", "reported", "throughput", "duration",
                       "completed", "failed", "send_span", "chunks_per_token",
                       "foreign_cpu", "tries")}
                     for r in runs],
            "pooled": {"qtune": pq, "vllm": pv}, "verdicts": verdicts,
        }, indent=2))
    return 0 if all(r.failed == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
