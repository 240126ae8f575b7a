"""qtune bench against a stand-in server that behaves like one engine with a
queue: requests are served one at a time, each taking SERVICE seconds, so
latency explodes past 1/SERVICE req/s and capacity under an SLO is known."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

from qtune.bench import BenchConfig, find_capacity, run_bench
from qtune.load.workload import Workload
from qtune.search.config import parse_slo

ROOT = Path(__file__).parent.parent
SERVICE = 0.01  # seconds per request, serialized: capacity ≈ 100 req/s


class QueueServer:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        lock = asyncio.Lock()

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "queue-model", "root": None}]})

        async def completions(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            async with lock:
                await asyncio.sleep(SERVICE)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = body["max_tokens"]
            for _ in range(n):
                chunk = {"choices": [{"index": 0, "text": " x"}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text="vllm:num_preemptions_total 3\n"
                                     "vllm:kv_cache_usage_perc 0.25\n")

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> str:
        self.thread.start()
        self.ready.wait(10)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def server():
    with QueueServer() as url:
        yield url


def test_single_run_json_shape_goodput_and_server_view(server):
    cfg = BenchConfig(urls=[server], workload=Workload(
        input_len=8, output_len=4, concurrency=2, requests=20, warmup_requests=2),
        slo=parse_slo("ttft_p99<=1s,e2e_p99<=1s"))
    res = run_bench(cfg)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(res[key]) == {"mean", "p50", "p90", "p99"}
    assert res["completed"] == 20 and res["failed"] == 0
    assert res["request_throughput"] > 0 and res["output_token_throughput"] > 0
    assert res["models"] == ["queue-model"]
    g = res["goodput"]
    assert g["good_requests"] == 20 and g["slo_met"]
    assert g["request_goodput"] == pytest.approx(res["request_throughput"])
    # The stand-in's counters do not move: zero preemptions during the run.
    assert res["server"]["preemptions"] == 0
    assert res["server"]["kv_cache_usage_peak"] == 0.25


def test_goodput_counts_only_requests_within_limits(server):
    # 4 concurrent streams behind a 10 ms serial queue: some TTFTs exceed 15 ms.
    cfg = BenchConfig(urls=[server], workload=Workload(
        input_len=8, output_len=2, concurrency=4, requests=40, warmup_requests=0),
        slo=parse_slo("ttft_p99<=15ms"))
    g = run_bench(cfg)["goodput"]
    assert 0 < g["good_requests"] < 40
    assert not g["slo_met"]


def test_repeats_and_comparison(server):
    cfg = BenchConfig(urls=[server, server], workload=Workload(
        input_len=8, output_len=2, concurrency=1, requests=10, warmup_requests=0),
        repeat=3)
    res = run_bench(cfg)
    assert len(res["runs"]) == 2 and all(len(r) == 3 for r in res["runs"])
    agg = res["repeats"][0]["e2e_p50"]
    assert len(agg["values"]) == 3 and agg["ci95"][0] <= agg["median"] <= agg["ci95"][1]
    ratio = res["comparison"]["e2e_p50"]
    # Same server twice: the ratio's interval must contain 1-ish values.
    assert 0.3 < ratio["ratio"] < 3
    assert ratio["ci95"][0] <= ratio["ratio"] <= ratio["ci95"][1]


def test_find_capacity_brackets_the_queue_limit(server):
    cfg = BenchConfig(urls=[server], workload=Workload(
        input_len=8, output_len=2, rate=10, requests=60, warmup_requests=0,
        arrival="constant"), slo=parse_slo("e2e_p99<=100ms"))
    cap = find_capacity(server, "queue-model", cfg)
    assert cap["found"], cap
    # Above 100 req/s the queue grows without bound; far below, latency is
    # one service time.  The answer must lie between.
    assert 15 <= cap["value"] <= 110, cap
    lo, hi = cap["bracket"]
    assert lo == cap["value"] and (hi is None or hi > lo)
    assert cap["at_value"]["ok"]  # re-measured at the answer
    assert any(not s["ok"] for s in cap["steps"])  # the bracket was closed


def test_capacity_needs_a_latency_slo(server):
    from qtune.errors import InputError

    with pytest.raises(InputError):
        find_capacity(server, "m", BenchConfig(urls=[server], workload=Workload(
            rate=1, requests=2)))


def test_cli_bench_json(server, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "qtune", "bench", "--url", server,
                        "--concurrency", "2", "--requests", "10", "--input-len", "8",
                        "--output-len", "3", "--json", "--csv", str(tmp_path / "r.csv")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["completed"] == 10 and d["failed"] == 0
    assert d["e2e_ms"]["p99"] >= d["e2e_ms"]["p50"]
    assert (tmp_path / "r.csv").read_text().startswith("ttft_p50")
    bad = subprocess.run([sys.executable, "-m", "qtune", "bench", "--url",
                          "http://127.0.0.1:9", "--requests", "2"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: ")


def _scripted_capacity(monkeypatch, holds) -> dict:
    """find_capacity with each run's outcome scripted: ``holds(rate, n)`` says
    whether the n-th run at ``rate`` meets the SLO."""
    import qtune.bench as bench

    seen: dict[float, int] = {}

    def fake_measure(url, model, w, cfg, **kw):
        seen[w.rate] = seen.get(w.rate, 0) + 1
        return {"holds": holds(w.rate, seen[w.rate])}

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "_meets", lambda s, slos, offered: (s["holds"], "scripted"))
    monkeypatch.setattr(bench, "metric_value", lambda s, m: 0.0)
    cfg = BenchConfig(urls=["u"], workload=Workload(rate=4, requests=10),
                      slo=parse_slo("ttft_p99<=400ms"))
    return find_capacity("u", "m", cfg)


def test_capacity_falls_back_to_a_load_that_passed_before(monkeypatch):
    """Near the knee a short run passes or fails by luck: loads in (64, 76]
    pass once and then fail.  The re-measure must fall back to a load that
    passed before (64) rather than creep down 5% at a time into more luck, and
    report only a load it measured as holding."""
    cap = _scripted_capacity(monkeypatch, lambda rate, n: rate <= 64 or (rate <= 76 and n == 1))
    assert cap["found"], cap
    assert cap["value"] == 64 and cap["at_value"] == {**cap["steps"][-1]}
    assert cap["at_value"]["ok"] and cap["at_value"]["load"] == 64
    assert cap["bracket"][1] > 64


def test_capacity_not_found_when_no_load_holds_on_re_measure(monkeypatch):
    # Every load below 50 passes once only.
    cap = _scripted_capacity(monkeypatch, lambda rate, n: n == 1 and rate < 50)
    assert not cap["found"] and "value" not in cap and "re-measured" in cap["reason"]
