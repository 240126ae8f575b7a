"""qtune bench against a stand-in server that behaves like one engine with a
queue: requests are served one at a time, each taking SERVICE seconds, so
latency explodes past 1/SERVICE req/s and capacity under an SLO is known."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from qtune.bench import BenchConfig, run_bench
from qtune.load.workload import Workload
from qtune.objectives import parse_slo
from tests.fakes.queue import queue_server
from tests.fakes.sse import Threaded

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def server():
    with queue_server() as url:
        yield url


def test_single_run_json_shape_goodput_and_server_view(server):
    cfg = BenchConfig(urls=[server], workload=Workload(
        input_len=8, output_len=4, concurrency=2, requests=20, warmup_requests=2),
        slo=parse_slo("ttft_p99<=1s,e2e_p99<=1s"), gauge_interval=0.02)
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
    assert res["server"]["kv_cache_usage_peak"] == 0.25  # from scrapes during the run
    assert res["server"]["scrapes"] >= 3
    # The client's own count of requests in flight: 2 streams.
    assert res["held_peak"] == 2


def test_goodput_counts_only_requests_within_limits():
    # Every other request waits 400 ms before its first token, the rest none:
    # a 150 ms TTFT limit splits them whatever the machine's load (a 10 ms
    # queue against a 15 ms limit counted no good request at all on 2 busy
    # cores).
    import asyncio
    import itertools

    seen = itertools.count()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if next(seen) % 2:
            await asyncio.sleep(0.4)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": " x"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"prompt_tokens": 8, "completion_tokens": body["max_tokens"]}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                         + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    with Threaded({"GET /v1/models": _models("m"),
                   "POST /v1/completions": completions}) as url:
        cfg = BenchConfig(urls=[url], model="m", workload=Workload(
            input_len=8, output_len=2, concurrency=4, requests=20, warmup_requests=0),
            slo=parse_slo("ttft_p99<=150ms"))
        g = run_bench(cfg)["goodput"]
    assert 4 <= g["good_requests"] <= 16, g
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
    # -o/--out: the JSON object as a file (strict JSON), its format by the suffix
    r = subprocess.run([sys.executable, "-m", "qtune", "bench", "--url", server,
                        "--concurrency", "2", "--requests", "6", "--input-len", "8",
                        "--output-len", "3", "-o", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path / "r.json").read_text(),
                       parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert saved["completed"] == 6
    # a server that does not answer: 6, not 1 (bad input)
    bad = subprocess.run([sys.executable, "-m", "qtune", "bench", "--url",
                          "http://127.0.0.1:9", "--requests", "2"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 6 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: ")


# --- failures, usage and prompt lengths (issue 13 items 6 and 7) -----------


def _qtune(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "qtune", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def _models(name: str, root: str | None = None):
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": name, "root": root}]})
    return models


def test_bench_exits_non_zero_and_says_why_when_every_request_fails():
    seen = 0

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        if seen % 4 == 0:
            return web.json_response({"error": "overloaded"}, status=503)
        request.transport.close()  # the server drops the connection
        return web.Response()


    with Threaded({"GET /v1/models": _models("m"),
                   "POST /v1/completions": completions}) as url:
        r = _qtune("bench", "--url", url, "--concurrency", "2", "--requests", "8",
                   "--warmup", "0", "--input-len", "4", "--output-len", "2")
        j = _qtune("bench", "--url", url, "--concurrency", "2", "--requests", "8",
                   "--warmup", "0", "--input-len", "4", "--output-len", "2", "--json")
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    # Counted by reason, e.g. "8 of 8 failed: 6 ServerDisconnectedError, 2 HTTP 503".
    assert "8 of 8 failed: " in r.stdout
    assert "HTTP 503" in r.stdout
    assert j.returncode == 3 and json.loads(j.stdout)["completed"] == 0


def test_usage_counts_not_believed_are_flagged_and_throughput_stays_sane():
    async def completions(request: web.Request) -> web.StreamResponse:
        from tests.fakes.sse import DONE, event, open_stream, text

        body = await request.json()
        resp = await open_stream(request)
        for i in range(body["max_tokens"]):
            await resp.write(text(f"t{i} "))
        await resp.write(event({"choices": [], "usage": {
            "prompt_tokens": 4, "completion_tokens": -5000}}) + DONE)
        return resp


    with Threaded({"GET /v1/models": _models("m"),
                   "POST /v1/completions": completions}) as url:
        res = run_bench(BenchConfig(urls=[url], scrape_metrics=False, workload=Workload(
            input_len=4, output_len=3, concurrency=2, requests=6, warmup_requests=0)))
        r = _qtune("bench", "--url", url, "--concurrency", "2", "--requests", "6",
                   "--warmup", "0", "--input-len", "4", "--output-len", "3",
                   "--no-server-metrics")
    assert res["completed"] == 6
    assert res["output_tokens"] == 18 and res["output_token_throughput"] > 0
    assert res["usage_distrusted"]["requests"] == 6
    assert "usage.completion_tokens=-5000 is negative" in res["usage_distrusted"]["example"]
    assert r.returncode == 0, r.stderr
    assert "usage counts were not believed for 6 requests" in r.stdout


def _counting_app(tmp_path, **kw):
    from tests.fakes.sse import CountingServer, bpe_tokenizer

    folder = tmp_path / "model"
    srv = CountingServer(bpe_tokenizer(folder), **kw)
    return srv, folder, lambda root: Threaded({
        "GET /v1/models": _models(str(root), str(root) if root else None),
        "POST /v1/completions": srv.completions,
        "POST /tokenize": srv.tokenize, "POST /detokenize": srv.detokenize})


def _wl(n: int = 40) -> Workload:
    return Workload(input_len=n, output_len=2, concurrency=2, requests=6,
                    warmup_requests=0)


def test_model_folder_gives_the_tokenizer_when_model_is_given(tmp_path):
    """`--model /path/to/model` without --tokenizer: the folder's own
    tokenizer, so the server counts what was asked (it counted 678 for 200
    on the CPU target)."""
    srv, folder, app = _counting_app(tmp_path, bos=1, tokenize=False)
    with app(folder) as url:
        res = run_bench(BenchConfig(urls=[url], model=str(folder), workload=_wl(),
                                    scrape_metrics=False))
    assert res["tokenizer"] == str(folder)
    assert srv.counts == [41] * 6  # 40 asked, plus the BOS
    assert "length_mismatch" not in res and "tokenizer_warning" not in res


def test_served_root_gives_the_tokenizer(tmp_path):
    srv, folder, app = _counting_app(tmp_path, bos=0, tokenize=False)
    with app(folder) as url:
        res = run_bench(BenchConfig(urls=[url], workload=_wl(), scrape_metrics=False))
    assert res["tokenizer"] == str(folder) and srv.counts == [40] * 6


def test_server_tokenize_when_no_folder_is_at_hand(tmp_path):
    srv, _, app = _counting_app(tmp_path, bos=1)
    with app(None) as url:
        res = run_bench(BenchConfig(urls=[url], model="served-name", workload=_wl(32),
                                    scrape_metrics=False))
    assert res["tokenizer"].endswith("/tokenize")
    assert srv.counts == [33] * 6
    assert res["prompt_length"]["requested_mean"] == 32
    assert "length_mismatch" not in res


def test_no_tokenizer_warns_on_every_output_and_in_json(tmp_path):
    srv, _, app = _counting_app(tmp_path, bos=0, tokenize=False)
    with app(None) as url:
        j = _qtune("bench", "--url", url, "--concurrency", "2", "--requests", "6",
                   "--warmup", "0", "--input-len", "40", "--output-len", "2",
                   "--no-server-metrics", "--json")
        h = _qtune("bench", "--url", url, "--concurrency", "1", "--requests", "2",
                   "--warmup", "0", "--input-len", "40", "--output-len", "2",
                   "--no-server-metrics", "--repeat", "2")
    d = json.loads(j.stdout)
    assert d["tokenizer"] is None and "no tokenizer" in d["tokenizer_warning"]
    assert d["length_mismatch"] > 0.1
    assert h.returncode == 0, h.stderr
    assert "no tokenizer for exact prompt lengths" in h.stdout
    # Each of the two runs carries its own warning.
    assert h.stdout.count("prompt tokens a request where 40 were asked for") == 2


def test_bench_duration_alone_runs_past_the_old_default_count(server):
    """`qtune bench --url U --duration D` stopped at 100 requests."""
    r = _qtune("bench", "--url", server, "--duration", "1.5", "--concurrency", "4",
               "--input-len", "4", "--output-len", "1", "--warmup", "0",
               "--no-server-metrics", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["completed"] > 100 and d["duration_s"] >= 1.4


def test_a_run_says_when_nothing_checked_its_prompts_hit_no_cache(server):
    """Fresh prompts are the rule; the hit rate is how a run shows it kept
    it.  An engine without prefix-cache counters (``transformers serve``),
    or a server that did not report them, gets the run's word for it."""
    wl = Workload(input_len=8, output_len=4, concurrency=2, requests=4, warmup_requests=0)
    res = run_bench(BenchConfig(urls=[server], workload=wl, metric_names=None))
    assert res["cache_unchecked"].startswith("the engine reports no prefix-cache counters")
    # the stand-in serves vLLM's names but no prefix-cache counter
    res = run_bench(BenchConfig(urls=[server], workload=wl))
    assert res["cache_unchecked"].startswith("no prefix-cache hit rate was read")
    # a shared-prefix workload is not a fresh-prompt one: nothing to say
    res = run_bench(BenchConfig(urls=[server], workload=dataclasses.replace(
        wl, prefix_count=2, prefix_len=4), metric_names=None))
    assert "cache_unchecked" not in res
