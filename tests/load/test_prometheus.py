"""``MetricsWatcher`` on vLLM's exposition format, one engine and two.

The texts follow what vLLM's ``PrometheusStatLogger`` writes: every sample
labelled ``model_name`` and ``engine`` (the data-parallel rank).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from qtune.engines.vllm import VLLM
from qtune.load.prometheus import MetricsWatcher, parse

NAMES = VLLM().metric_names()


def metrics(engines: dict[str, dict[str, float]]) -> str:
    """vLLM-like /metrics text: per engine, running, waiting, KV usage and
    the counters."""
    lines = []
    for name, kind in (("vllm:num_requests_running", "gauge"),
                       ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"),
                       ("vllm:generation_tokens", "counter"),
                       ("vllm:prompt_tokens", "counter"),
                       ("vllm:num_preemptions", "counter"),
                       ("vllm:request_success", "counter")):
        lines.append(f"# TYPE {name} {kind}")
        for e, vals in engines.items():
            key = name.split(":")[1]
            sample = name + ("_total" if kind == "counter" else "")
            lines.append(f'{sample}{{engine="{e}",model_name="m"}} {vals.get(key, 0.0)}')
    return "\n".join(lines) + "\n"


async def _serve(texts: list[str]) -> tuple[web.AppRunner, str]:
    """A /metrics endpoint answering each text once, in order."""
    pages = iter(texts)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=next(pages))

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def watch(texts: list[str]) -> dict | None:
    """Scrape each text once, in order, as the watcher would over a run: the
    first before the phase, the others during it, then the last once more
    after it (an after-scrape reads an idle server: it must not count)."""
    async def main() -> dict | None:
        runner, url = await _serve(texts)
        w = MetricsWatcher(url, NAMES, interval=3600)
        try:
            async with aiohttp.ClientSession() as session:
                for i, _ in enumerate(texts):
                    await w.scrape(session, during=i > 0)
        finally:
            await runner.cleanup()
        return w.report()

    return asyncio.run(main())


def test_one_engine_has_no_per_engine_breakdown():
    rep = watch([
        metrics({"0": {"generation_tokens": 100}}),
        metrics({"0": {"num_requests_running": 7, "kv_cache_usage_perc": 0.4,
                       "generation_tokens": 600, "prompt_tokens": 50}}),
    ])
    assert rep["generation_tokens"] == 500 and rep["prompt_tokens"] == 50
    assert rep["running_peak"] == 7 and rep["kv_cache_usage_peak"] == 0.4
    assert "engines" not in rep


def test_data_parallel_counts_add_up_but_kv_usage_is_the_fullest_engine():
    rep = watch([
        metrics({"0": {}, "1": {}}),
        metrics({"0": {"num_requests_running": 142, "kv_cache_usage_perc": 0.7,
                       "generation_tokens": 3200, "num_preemptions": 2},
                 "1": {"num_requests_running": 52, "kv_cache_usage_perc": 0.3,
                       "generation_tokens": 4200}}),
        metrics({"0": {"num_requests_running": 10, "kv_cache_usage_perc": 0.1,
                       "generation_tokens": 3200, "num_preemptions": 2,
                       "request_success": 12},
                 "1": {"num_requests_running": 90, "kv_cache_usage_perc": 0.6,
                       "generation_tokens": 4200, "request_success": 16}}),
    ])
    # Summed, two 70%/30% engines would read as a 100% full cache.
    assert rep["kv_cache_usage_peak"] == 0.7
    assert rep["running_peak"] == 194  # in flight on the server: both engines
    assert rep["generation_tokens"] == 7400 and rep["preemptions"] == 2
    e0, e1 = rep["engines"]
    assert (e0["engine"], e0["generation_tokens"], e0["running_peak"]) == ("0", 3200, 142)
    assert (e1["engine"], e1["running_peak"], e1["kv_cache_usage_peak"]) == ("1", 90, 0.6)
    assert e0["preemptions"] == 2 and e1["preemptions"] == 0
    assert (e0["requests"], e1["requests"]) == (12, 16)
    # Held = running + waiting at one scrape: engine 0's 142 (scrape 2),
    # engine 1's 90 (scrape 3).
    assert (e0["held_peak"], e1["held_peak"]) == (142, 90)
    assert rep["held_balance"] == 90 / 142


def test_a_slow_replica_at_its_max_num_seqs_shows_in_what_it_holds():
    """Both engines run at the cap (32): the slow one's backlog waits."""
    rep = watch([
        metrics({"0": {}, "1": {}}),
        metrics({"0": {"num_requests_running": 32, "num_requests_waiting": 60},
                 "1": {"num_requests_running": 32, "num_requests_waiting": 2}}),
        metrics({"0": {"num_requests_running": 32, "num_requests_waiting": 80},
                 "1": {"num_requests_running": 30}}),
    ])
    e0, e1 = rep["engines"]
    assert e0["running_peak"] == e1["running_peak"] == 32
    assert (e0["held_peak"], e1["held_peak"]) == (112, 34)
    assert rep["held_balance"] == 34 / 112


def test_engines_sort_numerically_and_other_labels_are_summed():
    snap = parse('# TYPE vllm:generation_tokens counter\n'
                 'vllm:generation_tokens_total{engine="10",model_name="a"} 1\n'
                 'vllm:generation_tokens_total{engine="2",model_name="a"} 2\n'
                 'vllm:generation_tokens_total{engine="2",model_name="b"} 3\n')
    assert snap["vllm:generation_tokens"] == {"10": 1.0, "2": 5.0}
    rep = watch([metrics({"10": {}, "2": {}}),
                 metrics({"10": {"generation_tokens": 1}, "2": {"generation_tokens": 5}})])
    assert [e["engine"] for e in rep["engines"]] == ["2", "10"]


def test_counters_before_and_after_only_give_no_peaks():
    """Without scrapes during the phase, gauges say nothing: no peak is
    invented from an idle server, while the counters are exact."""
    async def main() -> dict | None:
        runner, url = await _serve([
            metrics({"0": {"generation_tokens": 100, "num_requests_running": 0}}),
            metrics({"0": {"generation_tokens": 900, "num_requests_running": 0}}),
        ])
        w = MetricsWatcher(url, NAMES)
        try:
            await w.start()
            return await w.stop()
        finally:
            await runner.cleanup()

    rep = asyncio.run(main())
    assert rep is not None
    assert rep["generation_tokens"] == 800 and rep["scrapes"] == 2
    assert rep["running_peak"] is None and rep["kv_cache_usage_peak"] is None


def test_a_phase_waits_until_the_server_has_finished_what_an_earlier_one_left():
    """A probe stopped early leaves its requests on the server: the next
    phase starts only once the running and waiting gauges read 0 (on 2 CPU
    cores eleven probes failed one after another without this wait)."""
    import qtune.load.prometheus as prom

    async def go(texts: list[str], timeout: float = 30.0) -> float | None:
        runner, url = await _serve(texts)
        try:
            return await prom.wait_idle(url, VLLM().metric_names(), timeout=timeout)
        finally:
            await runner.cleanup()

    prom.IDLE_POLL_S, poll = 0.01, prom.IDLE_POLL_S
    try:
        busy = [metrics({"0": {"num_requests_running": 3, "num_requests_waiting": 9}}),
                metrics({"0": {"num_requests_running": 1}}),
                metrics({"0": {}})]
        waited = asyncio.run(go(busy))
        assert waited is not None and waited >= 2 * prom.IDLE_POLL_S
        # a server that stays busy is waited for up to the timeout, no longer
        stuck = asyncio.run(go([busy[0]] * 1000, timeout=0.05))
        assert stuck is not None and 0.05 <= stuck < 5
    finally:
        prom.IDLE_POLL_S = poll
    # a NaN gauge is not known: no wait (the hostile corpus serves one)
    nan = metrics({"0": {"num_requests_running": float("nan")}})
    assert asyncio.run(go([nan] * 1000)) is None
    # a page that is no metrics text: not known, and no wait
    assert asyncio.run(go(["no metrics here {"])) is None
    # a metrics page without the gauges reads as idle
    idle = asyncio.run(go(["# TYPE other gauge\nother 1\n"]))
    assert idle is not None and idle < 1


def test_a_cancelled_phase_leaves_no_session_open():
    """An interrupted study cancels the measured phase: the watcher's scrape
    loop ends and its connection is closed with it, where before aiohttp printed "Unclosed
    client session" after "interrupted: servers stopped, study saved" (GPU
    run 23)."""
    import gc

    from qtune.load import Workload, run_load
    from tests.fakes.sse import DONE, open_stream, serve

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await asyncio.sleep(30)  # cancelled long before it answers
        await resp.write(DONE)
        return resp

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=metrics({"0": {"generation_tokens": 1}}))

    async def main() -> list[str]:
        seen: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, ctx: seen.append(str(ctx.get("message"))))
        async with serve(slow, get={"/metrics": page}) as base:
            task = asyncio.create_task(run_load(
                base, "m",
                Workload(input_len=4, output_len=2, concurrency=1, requests=2,
                         warmup_requests=0),
                scrape_metrics=True, metric_names=NAMES, gauge_interval=0.05))
            await asyncio.sleep(0.5)
            task.cancel()
            # (not pytest.raises: its traceback would keep the phase's frame,
            # and the watcher in it, alive past the collection below)
            cancelled = False
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            assert cancelled
        await asyncio.sleep(0.2)
        # the watcher's scrape loop ended with the phase (it held the session)
        left = [name for t in asyncio.all_tasks()
                if "MetricsWatcher" in (name := getattr(t.get_coro(), "__qualname__", ""))]
        assert left == []
        gc.collect()
        await asyncio.sleep(0)
        return seen

    assert [m for m in asyncio.run(main()) if "Unclosed" in m] == []
