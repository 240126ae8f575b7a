#!/usr/bin/env python3
"""Whose failure is a failed request that the server never logged? Keep-alive
connections (qtune's client as it ships) against a fresh connection per
request (``force_close``), interleaved on one server (issue 27's lead: 16 of
77 capacity probes on the CPU target were decided by `ServerDisconnectedError`
or `Can not write request body`, with nothing in vLLM's log).

One vLLM server (the engine defaults unless --params); at each --rates load,
--rounds rounds of each arm in turn (ABAB...), each round a measured phase of
its own fresh prompts (the capacity probe's workload: warm-up, cache reset,
Poisson arrivals, counters read before and after).  Every request is traced
through aiohttp's TraceConfig: whether it went out on a reused connection or
a new one, and whether it failed before the response's headers (connect,
write) or after (mid-stream).  The event loop's lag is sampled every 50 ms.

Prints per arm and load: requests, failures (before/after headers, on
reused/new connections), the errors, the loop's lag p99/max, and the
throughput and e2e p50 of the rounds.

    python benchmarks/client_side_ab.py --rates 6,8 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import launch, median, pct, set_server_nice, table, wait_until_alone  # noqa: E402

import qtune.load as load  # noqa: E402
from qtune.engines.vllm import VLLM  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.metrics import summarize  # noqa: E402

ARMS = ("keep-alive", "force_close")
# --compare nice: the server's autogroup (its session: qtune starts it in one
# of its own) at nice 0 against nice 10, the client unchanged (keep-alive).
NICE_ARMS = ("server nice 0", "server nice 10")


class Trace:
    """Per request: reused or new connection, failed before or after headers."""

    def __init__(self) -> None:
        self.requests: list[SimpleNamespace] = []

    def config(self) -> aiohttp.TraceConfig:
        tc = aiohttp.TraceConfig()

        async def start(_s: Any, ctx: SimpleNamespace, params: Any) -> None:
            ctx.t0, ctx.reused, ctx.headers, ctx.exc = time.perf_counter(), None, False, None
            if str(params.url).endswith("/completions"):
                self.requests.append(ctx)

        async def reuse(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
            ctx.reused = True

        async def new(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
            ctx.reused = False

        async def end(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
            ctx.headers = True

        async def exc(_s: Any, ctx: SimpleNamespace, p: Any) -> None:
            ctx.exc = f"{type(p.exception).__name__}: {p.exception}"[:120]

        tc.on_request_start.append(start)
        tc.on_connection_reuseconn.append(reuse)
        tc.on_connection_create_end.append(new)
        tc.on_request_end.append(end)
        tc.on_request_exception.append(exc)
        return tc


def patch_client(arm: str, trace: Trace) -> None:
    """qtune.load's session and connector, as the arm has them, traced."""
    real_session = aiohttp.ClientSession
    real_conn = aiohttp.TCPConnector

    def connector(**kw: Any) -> aiohttp.TCPConnector:
        if arm == "force_close":
            kw.pop("keepalive_timeout", None)
            kw["force_close"] = True
        return real_conn(**kw)

    def session(*a: Any, **kw: Any) -> aiohttp.ClientSession:
        return real_session(*a, trace_configs=[trace.config()], **kw)

    load.aiohttp = SimpleNamespace(**{k: getattr(aiohttp, k) for k in dir(aiohttp)
                                      if not k.startswith("__")})  # type: ignore[assignment]
    load.aiohttp.TCPConnector = connector
    load.aiohttp.ClientSession = session


async def one_round(url: str, model: str, tok: str,
                    wl: Workload) -> tuple[Any, list[tuple[float, float, float]]]:
    """The phase's result and the loop's lag samples: (perf_counter, lag s,
    the loop thread's CPU seconds over the sample: near the lag when the loop
    itself was busy, near 0 when the process waited for a core)."""
    eng = VLLM()
    lags: list[tuple[float, float, float]] = []
    stop = asyncio.Event()

    async def lagmon() -> None:
        while not stop.is_set():
            t, c = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            lags.append((now, now - t - 0.05, time.thread_time() - c))

    mon = asyncio.create_task(lagmon())
    try:
        res = await load.run_load(url, model, wl, tokenizer=Path(tok), scrape_metrics=True,
                                  reset_cache=True, metric_names=eng.metric_names(),
                                  reset_paths=eng.cache_reset_paths(), gauge_interval=None)
    finally:
        stop.set()
        await mon
    return res, lags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--params", default="{}", help="JSON launch params ({}: defaults)")
    ap.add_argument("--rates", default="6,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=20.0, help="seconds of arrivals a round")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--compare", choices=("connection", "nice"), default="connection")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    arms = ARMS if a.compare == "connection" else NICE_ARMS
    rates = [float(r) for r in a.rates.split(",")]
    wait_until_alone()
    work = Path(tempfile.mkdtemp(prefix="qtune-conn-"))
    server, spec, tok = launch(a.model, json.loads(a.params), work)
    rows, out = [], []
    t_all = time.monotonic()
    with server:
        server.wait_ready(900)
        for rate in rates:
            per: dict[str, dict[str, Any]] = {
                arm: {"reqs": [], "errors": Counter(), "lags": [], "inside": [], "thr": [],
                      "cpu_share": [], "big_lag_cpu": [],
                      "e2e50": []}
                for arm in arms}
            for rnd in range(a.rounds):
                order = arms if rnd % 2 == 0 else arms[::-1]
                for arm in order:
                    trace = Trace()
                    if a.compare == "nice":
                        assert server.proc is not None
                        set_server_nice(server.proc.pid, int(arm.rsplit(" ", 1)[1]))
                    patch_client(arm if a.compare == "connection" else ARMS[0], trace)
                    wl = Workload(input_len=a.input_len, output_len=a.output_len, rate=rate,
                                  requests=int(rate * a.window), warmup_requests=a.warmup,
                                  seed=int(rate * 1000) + 10 * rnd + arms.index(arm))
                    c0, w0 = time.process_time(), time.perf_counter()
                    res, lagged = asyncio.run(one_round(spec.base_url, spec.served_model,
                                                        tok, wl))
                    cpu_share = (time.process_time() - c0) / (time.perf_counter() - w0)
                    s = summarize(res.samples, res.duration)
                    # the measured phase: first send to last completion
                    t0 = min(x.start for x in res.samples)
                    t1 = max(x.start + (x.e2e or 0) for x in res.samples)
                    inside = [lag for t, lag, _ in lagged if t0 <= t <= t1]
                    lags = [lag for _, lag, _ in lagged]
                    # the lags over 0.5 s: the loop thread's CPU over them
                    big = [(lag, cpu) for _, lag, cpu in lagged if lag > 0.5]
                    p = per[arm]
                    p["cpu_share"].append(cpu_share)
                    p["big_lag_cpu"] += big
                    p["inside"] += inside
                    p["reqs"] += trace.requests
                    p["errors"].update(s["errors"])
                    p["lags"] += lags
                    p["thr"].append(s["request_throughput"])
                    p["e2e50"].append((s["e2e_ms"] or {}).get("p50"))
                    print(f"  {rate:g} req/s round {rnd + 1} {arm}: {s['completed']} ok, "
                          f"{s['failed']} failed {dict(s['errors']) or ''} "
                          f"lag max {max(lags, default=0) * 1000:.0f} ms, measured phase "
                          f"{max(inside, default=0) * 1000:.0f} ms; client CPU "
                          f"{cpu_share:.0%} of a core; lags > 0.5 s: {len(big)}, "
                          f"{sum(c for _, c in big):.1f} s "
                          f"CPU over {sum(g for g, _ in big):.1f} s", flush=True)
            for arm in arms:
                p = per[arm]
                reqs = p["reqs"]
                before = [r for r in reqs if r.exc is not None]
                failed = sum(p["errors"].values())
                rec = {
                    "rate": rate, "arm": arm, "requests": len(reqs), "failed": failed,
                    "failed_before_headers": len(before),
                    "before_on_reused": sum(bool(r.reused) for r in before),
                    "before_on_new": sum(r.reused is False for r in before),
                    "reused_share": (sum(bool(r.reused) for r in reqs) / len(reqs)
                                     if reqs else None),
                    "errors": dict(p["errors"]),
                    "lag_p99_ms": (pct(p["lags"], 99) or 0) * 1000,
                    "lag_max_ms": max(p["lags"], default=0) * 1000,
                    "measured_lag_p99_ms": (pct(p["inside"], 99) or 0) * 1000,
                    "measured_lag_max_ms": max(p["inside"], default=0) * 1000,
                    "client_cpu_share": p["cpu_share"],
                    "lags_over_half_s": [{"lag_s": g, "loop_cpu_s": c}
                                         for g, c in p["big_lag_cpu"]],
                    "throughput": p["thr"], "e2e_p50_ms": p["e2e50"],
                }
                out.append(rec)
                rows.append([f"{rate:g}", arm, str(len(reqs)), str(failed),
                             f"{len(before)} ({rec['before_on_reused']} reused)",
                             f"{rec['reused_share']:.0%}" if reqs else "-",
                             f"{rec['lag_p99_ms']:.0f} / {rec['lag_max_ms']:.0f}",
                             f"{rec['measured_lag_p99_ms']:.0f} / "
                             f"{rec['measured_lag_max_ms']:.0f}",
                             f"{median(p['thr']) or 0:.2f}",
                             f"{median(p['e2e50']) or 0:.0f}"])
            if a.json:
                a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)},
                                              "arms": out}, indent=1, default=str))
    print()
    print(table(["req/s", "client", "requests", "failed", "failed before headers",
                 "on a reused conn.", "loop lag p99/max ms",
                 "in the measured phase", "thr. median",
                 "e2e p50 median ms"], rows))
    for rec in out:
        if rec["errors"]:
            print(f"{rec['rate']:g} {rec['arm']}: {rec['errors']}")
    print(f"\nwall time {time.monotonic() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
