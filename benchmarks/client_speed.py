#!/usr/bin/env python3
"""Client speed: how fast qtune's load client is, against vLLM's client.

A minimal OpenAI-compatible streaming server (aiohttp.web) runs in a
separate process and answers ``POST /v1/completions`` at once: ``max_tokens``
SSE chunks of one token each, a usage chunk (``choices: []``), then
``data: [DONE]``.  The server does no work, so what the clients measure is
their own cost plus the loopback and the mock's HTTP handling.

Clients, in this (benchmark) process only, one at a time:

  qtune        ``qtune.load.run_load`` as ``qtune search`` calls it (prompts
               drawn from the word-level tokenizer)
  qtune-notok  the same without a tokenizer (prompts of common words):
               isolates the cost of qtune's prompt generation (built before
               the first send in current qtune, so it shows in CPU/request
               and wall time, not in req/s or latency)
  vllm         ``vllm.benchmarks.serve.benchmark`` (the loop of
               ``vllm bench serve``), prompts pre-built from the same
               ``PromptFactory`` sequence

Modes (same request count for every client):

  burst  every request at once (vLLM --request-rate inf; qtune a rate of
         1e9 req/s, which sends without ever sleeping)
  c64    64 requests in flight (vLLM --max-concurrency 64; qtune
         --concurrency 64)
  c1     one at a time: the bare per-request overhead

Per run: achieved requests/s = completed / (first send -> last token) from
per-request data (same definition for all), client TTFT and E2E p50/p99 (the
server time is ~0, so this is what client + loopback + mock add), the
benchmark process's CPU time per request, and the mock server's CPU share
(near 100% means the server, not the client, bounds req/s).  Clients are
interleaved and rotated each repeat; the table shows medians of repeats
and the ratio to vllm.

    python benchmarks/client_speed.py             # ~1-2 min
    python benchmarks/client_speed.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Monitor, fmt, median, pct, ratio, table, wait_until_alone  # noqa: E402

MODEL = "mock-model"


# ------------------------------------------------------------ mock server
def serve(port: int, chunk_write: str) -> None:
    import resource

    from aiohttp import web

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    done = b"data: [DONE]\n\n"
    cache: dict[str, bytes] = {}

    def token_chunk(model: str) -> bytes:
        if model not in cache:
            cache[model] = b"data: " + json.dumps({
                "id": "cmpl-mock", "object": "text_completion", "created": 0,
                "model": model, "choices": [{"index": 0, "text": " tok",
                                             "logprobs": None,
                                             "finish_reason": None}],
            }).encode() + b"\n\n"
        return cache[model]

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = max(1, int(body.get("max_tokens") or 16))
        model = str(body.get("model") or MODEL)
        p = body.get("prompt") or ""
        ptoks = p.count(" ") + 1 if isinstance(p, str) else len(p)
        usage = b"data: " + json.dumps({
            "id": "cmpl-mock", "object": "text_completion", "created": 0,
            "model": model, "choices": [],
            "usage": {"prompt_tokens": ptoks, "completion_tokens": n,
                      "total_tokens": ptoks + n},
        }).encode() + b"\n\n"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunk = token_chunk(model)
        if chunk_write == "single":
            await resp.write(chunk * n + usage + done)
        else:  # one write per SSE event, like a real server
            for _ in range(n):
                await resp.write(chunk)
            await resp.write(usage)
            await resp.write(done)
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="")  # vLLM's client scrapes it; nothing to say

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                backlog=4096)


class MockServer:
    def __init__(self, port: int, chunk_write: str) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port),
             "--chunk-write", chunk_write],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    sys.exit("mock server did not start")
                time.sleep(0.1)
        import psutil

        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ------------------------------------------------------------ clients
def recs_qtune(samples) -> tuple[list[dict], int]:
    ok = [s for s in samples if s.ok]
    return [{"start": s.start, "ttft": s.ttft, "e2e": s.e2e} for s in ok], \
        len(samples) - len(ok)


async def client_qtune(base: str, a: argparse.Namespace, mode: str, n: int,
                       tok: Path | None) -> tuple[list[dict], int]:
    from qtune.load import Workload, run_load

    kw: dict[str, Any] = ({"rate": 1e9} if mode == "burst"
                          else {"concurrency": int(mode[1:])})
    wl = Workload(input_len=a.input_len, output_len=a.output_len, requests=n,
                  warmup_requests=0, seed=a.seed, **kw)
    res = await run_load(base, MODEL, wl, tokenizer=tok)
    return recs_qtune(res.samples)


async def client_vllm(base: str, a: argparse.Namespace, mode: str,
                      prompts: list[tuple[str, int]]) -> tuple[list[dict], int]:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    reqs = [SampleRequest(prompt=t, prompt_len=k, expected_output_len=a.output_len)
            for t, k in prompts]
    with contextlib.redirect_stdout(_SINK):
        r = await benchmark(
            task_type=TaskType.GENERATION, endpoint_type="openai",
            api_url=base + "/v1/completions", base_url=base, model_id=MODEL,
            model_name=None, tokenizer=None, input_requests=reqs, logprobs=None,
            request_rate=float("inf"), burstiness=1.0, disable_tqdm=True,
            num_warmups=0, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
            selected_percentiles=[50.0, 99.0], ignore_eos=True,
            goodput_config_dict={},
            max_concurrency=None if mode == "burst" else int(mode[1:]),
            lora_modules=None, extra_headers=None,
            extra_body={"temperature": 0.0}, ready_check_timeout_sec=0,
        )
    recs, failed = [], 0
    for k in range(len(r["ttfts"])):
        if r["errors"][k] or not r["output_lens"][k]:
            failed += 1
            continue
        recs.append({"start": r["start_times"][k], "ttft": r["ttfts"][k],
                     "e2e": r["latencies"][k]})
    return recs, failed


class _Sink:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


_SINK = _Sink()


def measure(client: str, srv: MockServer, a, mode: str, n: int, tok, prompts) -> dict:
    gc.collect()
    cpu0, srv0, t0 = time.process_time(), srv.cpu(), time.perf_counter()
    if client == "vllm":
        recs, failed = asyncio.run(client_vllm(srv.base_url, a, mode, prompts[:n]))
        gc.unfreeze()  # benchmark() callers freeze; be safe for the next client
    else:
        recs, failed = asyncio.run(client_qtune(
            srv.base_url, a, mode, n, tok if client == "qtune" else None))
    wall = time.perf_counter() - t0
    cpu, scpu = time.process_time() - cpu0, srv.cpu() - srv0
    span = (max(r["start"] + r["e2e"] for r in recs) - min(r["start"] for r in recs)
            if recs else float("nan"))
    return {
        "completed": len(recs), "failed": failed,
        "req_per_s": len(recs) / span if recs else 0.0,
        "ttft_p50": pct((r["ttft"] * 1e3 for r in recs), 50),
        "ttft_p99": pct((r["ttft"] * 1e3 for r in recs), 99),
        "e2e_p50": pct((r["e2e"] * 1e3 for r in recs), 50),
        "e2e_p99": pct((r["e2e"] * 1e3 for r in recs), 99),
        "cpu_us_per_req": cpu / max(1, n) * 1e6,
        "server_cpu": scpu / wall,
        "wall_s": wall,
    }


ROWS = [  # key, label, digits
    ("req_per_s", "achieved req/s", 0),
    ("ttft_p50", "client TTFT p50 ms", 2),
    ("ttft_p99", "client TTFT p99 ms", 2),
    ("e2e_p50", "client E2E p50 ms", 2),
    ("e2e_p99", "client E2E p99 ms", 2),
    ("cpu_us_per_req", "client CPU us/request", 0),
    ("server_cpu", "mock server CPU share", 2),
    ("wall_s", "wall s (whole call)", 2),
    ("foreign_cpu", "foreign CPU share", 2),
    ("failed", "failed requests", 0),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--chunk-write", choices=("each", "single"), default="each",
                    help="mock writes each SSE event separately (each) or the "
                    "whole stream in one write (single)")
    ap.add_argument("--requests", type=int, default=2000,
                    help="per run for burst and c64 (2000)")
    ap.add_argument("--serial-requests", type=int, default=500,
                    help="per run for c1 (500)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--modes", default="burst,cN,c1",
                    help="comma list of burst, cN (--concurrency), c1")
    ap.add_argument("--clients", default="qtune,qtune-notok,vllm")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32, help="SSE token chunks")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tries", type=int, default=4)
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="repeat a run when other processes used more than this "
                    "share of the machine's CPU meanwhile (0.10)")
    ap.add_argument("--quiet", type=float, default=10.0,
                    help="seconds without another vLLM server before a run (10)")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for other vLLM servers to finish")
    ap.add_argument("--quick", action="store_true",
                    help="300 requests, 100 serial, 1 repeat")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.serve:
        serve(a.serve, a.chunk_write)
        return 0
    if a.quick:
        a.requests, a.serial_requests, a.repeats = 300, 100, 1

    from qtune.load import Workload
    from qtune.model import resolve_model
    from qtune.server import free_port

    tok = resolve_model(None).tokenizer_dir
    n_max = max(a.requests, a.serial_requests)
    try:  # the sequence qtune's run_load draws
        from qtune.load.prompts import RequestSource

        wl = Workload(input_len=a.input_len, output_len=a.output_len, requests=n_max,
                      warmup_requests=0, seed=a.seed, concurrency=1)
        prompts = [(r.prompt, r.prompt_tokens)
                   for r in RequestSource(wl, tok, a.seed).take(n_max)]
    except ImportError:  # older qtune
        from qtune.load.prompts import PromptFactory

        pf = PromptFactory(tok, a.seed)
        prompts = [pf.prompt(a.input_len) for _ in range(n_max)]
    modes = [f"c{a.concurrency}" if m == "cN" else m for m in a.modes.split(",")]
    clients = a.clients.split(",")
    print(f"client speed: {', '.join(clients)}; modes {', '.join(modes)}; "
          f"{a.requests} requests ({a.serial_requests} for c1), input "
          f"{a.input_len} tok, {a.output_len} SSE chunks/request, mock writes "
          f"{a.chunk_write}; {a.repeats} interleaved repeats, {os.cpu_count()} CPUs",
          flush=True)

    if not a.no_wait:
        wait_until_alone(quiet=a.quiet)
    srv = MockServer(free_port(), a.chunk_write)
    results: dict[str, dict[str, list[dict]]] = {m: {c: [] for c in clients} for m in modes}
    try:
        # one throw-away run per client: imports, first connections
        for c in clients:
            measure(c, srv, a, "c1", 20, tok, prompts)
        for rep in range(a.repeats):
            order = clients[rep % len(clients):] + clients[:rep % len(clients)]
            for mode in modes:
                n = a.serial_requests if mode == "c1" else a.requests
                for c in order:
                    for attempt in range(1, a.max_tries + 1):
                        if not a.no_wait:
                            wait_until_alone(quiet=a.quiet)
                        with Monitor([srv.proc.pid]) as mon:
                            r = measure(c, srv, a, mode, n, tok, prompts)
                        r["foreign_cpu"] = mon.foreign_cpu
                        print(f"  rep {rep + 1} {mode:5s} {c:11s} "
                              f"{r['req_per_s']:7.0f} req/s  TTFT p50 "
                              f"{fmt(r['ttft_p50'])} ms  E2E p99 {fmt(r['e2e_p99'])}"
                              f" ms  {r['cpu_us_per_req']:.0f} us CPU/req  server "
                              f"CPU {r['server_cpu']:.0%}  foreign CPU "
                              f"{mon.foreign_cpu:.0%}", flush=True)
                        r["tries"] = attempt
                        why = []
                        if mon.intruders:
                            why.append("another vLLM server ran meanwhile")
                        if mon.foreign_cpu > a.max_foreign:
                            why.append(f"foreign CPU > {a.max_foreign:.0%}")
                        if not why or a.no_wait:
                            break
                        if mon.describe():
                            why.append("top others: " + mon.describe())
                        print("    " + "; ".join(why) + ": "
                              + ("repeating" if attempt < a.max_tries else "kept"),
                              flush=True)
                    results[mode][c].append(r)
                    time.sleep(0.3)
    finally:
        srv.stop()

    summary: dict[str, Any] = {}
    for mode in modes:
        n = a.serial_requests if mode == "c1" else a.requests
        print(f"\nmode {mode}: {n} requests, medians of {a.repeats} repeat(s)")
        med = {c: {k: median(r[k] for r in results[mode][c]) for k, _, _ in ROWS}
               for c in clients}
        summary[mode] = med
        others = [c for c in clients if c != "vllm"]
        hdr = ["metric"] + clients + (
            [f"{c}/vllm" for c in others] if "vllm" in clients else [])
        rows = []
        for k, label, nd in ROWS:
            row = [label] + [fmt(med[c][k], nd) for c in clients]
            if "vllm" in clients:
                row += [fmt(ratio(med[c][k], med["vllm"][k]), 3) for c in others]
            rows.append(row)
        print(table(hdr, rows))
    if a.json:
        a.json.write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path)
                                                 else v for k, v in vars(a).items()},
                                      "runs": results, "medians": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
