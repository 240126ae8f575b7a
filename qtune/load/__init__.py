"""Load generator: drives a streaming workload against one base URL.

Knows nothing of engines or Optuna: it takes a URL, a served model name, a
``Workload`` and an optional tokenizer folder, and returns per-request
samples.  Requests (prompts and lengths) are built before a phase starts, so
tokenization never delays a send or a timestamp.  Warm-up requests run first,
at the same arrival pattern, with prompts from another seed; they finish
before the measured phase starts, so no warm-up request overlaps the
measured window.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from qtune import seeds
from qtune.launch import IGNORE_EOS, MetricNames
from qtune.load.client import RequestSample, build_body, sample_checks, send
from qtune.load.prompts import PromptFactory, Request, RequestSource, ServerTokenizer
from qtune.load.workload import Workload

__all__ = [
    "LoadResult", "PromptFactory", "RequestSample", "ServerTokenizer", "Workload",
    "run_load",
]

# Requests prepared ahead for a phase bounded only by time; more are built
# (between sends) if a fast server drains them.
_POOL = 256
# At most this many requests are built ahead of a time-bound phase: at ~5 KB
# a 1k-token prompt, 100 MB.
_POOL_MAX = 20_000


def _pool_size(wl: Workload, duration: float | None) -> int:
    """Requests built before a phase bounded only by time: the whole phase at
    the offered rate, plus a quarter for Poisson luck, so that no prompt is
    built (a ``/tokenize`` round trip with a server's tokenizer) while
    requests are in flight.  A closed loop's count cannot be known ahead:
    ``_POOL``, topped up between sends if a fast server drains it."""
    if wl.rate is not None and duration:
        return min(_POOL_MAX, max(_POOL, math.ceil(wl.rate * duration * 1.25) + 32))
    return _POOL


# Seconds a pooled connection may stay idle and still be reused; below the
# 5 s keep-alive timeout of uvicorn (vLLM, SGLang).
KEEPALIVE_S = 2.0


@dataclass
class LoadResult:
    samples: list[RequestSample]
    duration: float  # first measured send → last measured completion
    warmup: list[RequestSample]
    saturated: bool = False  # stopped early: in-flight requests piled up
    server: dict[str, Any] | None = None  # Prometheus view, when offered
    stopped: str | None = None  # why the measured phase ended early, if it did
    warmup_s: float = 0.0  # wall time of the warm-up phase
    cache_reset: bool | None = None  # prefix cache emptied before the phase (None: not tried)
    # Usage not believed, prompt lengths not the ones asked for
    # (``client.sample_checks``); empty when all is well.
    checks: dict[str, Any] = field(default_factory=dict)
    # The client's own event loop's lateness in the measured phase (LoopLag)
    client_lag: dict[str, float] | None = None
    # Seconds waited, before the warm-up, for the server to finish what an
    # earlier phase left (``prometheus.wait_idle``; None: not known).
    idle_wait_s: float | None = None


ProgressFn = Callable[[str, int, int | None], None]


def inter_arrivals(wl: Workload, rng: random.Random) -> Callable[[], float]:
    """Gaps between sends.  Gamma(shape=b, scale=1/(rate·b)) has mean 1/rate
    for any burstiness b; b = 1 is Poisson (as ``vllm bench serve``)."""
    assert wl.rate is not None
    rate = wl.rate
    if wl.arrival == "constant":
        return lambda: 1.0 / rate
    if wl.burstiness == 1.0:
        return lambda: rng.expovariate(rate)
    b = wl.burstiness
    return lambda: rng.gammavariate(b, 1.0 / (rate * b))


# A watcher sees (finished samples, in-flight samples, now) a few times a
# second and returns a reason to stop the measured phase early, or None.
Watcher = Callable[[list[RequestSample], list[RequestSample], float], "str | None"]


def _normalised(gap: Callable[[], float], n: int, rate: float) -> Callable[[], float]:
    """A count-bound run offers exactly ``rate``: the n random gaps are
    rescaled to sum to n/rate, as ``vllm bench serve`` does.  Without it a
    200-request Poisson run at "4 req/s" offers 4.3 with one seed and 3.8
    with another, and latencies are measured at a load nobody asked for."""
    gaps = [gap() for _ in range(n)]
    scale = (n / rate) / sum(gaps) if sum(gaps) > 0 else 1.0
    it = iter([g * scale for g in gaps])
    return lambda: next(it, 1.0 / rate)


async def _phase(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    wl: Workload,
    source: RequestSource,
    count: int | None,
    duration: float | None,
    arrival_seed: int,
    phase: str,
    progress: ProgressFn | None,
    max_inflight: int | None,
    watch: Watcher | None = None,
    fields: Mapping[str, Any] = IGNORE_EOS,
) -> tuple[list[RequestSample], float, str | None]:
    # In a thread: with the server's tokenizer each prompt is a /tokenize
    # round trip, and the loop stays free for whatever else runs on it.
    ready: list[Request] = await asyncio.to_thread(
        source.take, count if count is not None else _pool_size(wl, duration))
    samples: list[RequestSample] = []
    inflight: dict[int, RequestSample] = {}  # by id(): samples are not hashable
    tasks: list[asyncio.Task[None]] = []
    stopped: str | None = None
    t0 = time.perf_counter()
    stop_at = t0 + duration if duration else None

    def more(i: int) -> bool:
        if stopped or (count is not None and i >= count):
            return False
        return stop_at is None or time.perf_counter() < stop_at

    def request(i: int) -> Request:
        while i >= len(ready):
            ready.append(source.next())
        return ready[i]

    async def one(req: Request) -> None:
        body = build_body(wl.endpoint, model, req.prompt, req.max_tokens, fields)
        s = RequestSample(start=time.perf_counter(),
                          requested_prompt_tokens=req.requested_tokens)
        inflight[id(s)] = s
        try:
            await send(session, url, body, prompt_tokens=req.prompt_tokens, sample=s,
                       timeout=wl.request_timeout, stall_timeout=wl.stall_timeout)
        finally:
            inflight.pop(id(s), None)
        samples.append(s)
        if progress:
            progress(phase, len(samples), count)

    async def drive() -> None:
        nonlocal stopped
        if wl.rate is not None:
            gap = inter_arrivals(wl, random.Random(arrival_seed))
            if count is not None and duration is None and wl.arrival != "constant":
                gap = _normalised(gap, count, wl.rate)
            next_at = t0
            i = 0
            while more(i):
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not more(i):
                    break
                if max_inflight is not None and len(inflight) >= max_inflight:
                    # The server no longer keeps up: the backlog only grows,
                    # and every further request measures the queue.
                    stopped = "saturated"
                    break
                tasks.append(asyncio.create_task(one(request(i))))
                i += 1
                next_at += gap()
            await asyncio.gather(*tasks)
        else:
            issued = 0

            async def worker() -> None:
                nonlocal issued
                while more(issued):
                    req = request(issued)
                    issued += 1
                    await one(req)

            await asyncio.gather(*(worker() for _ in range(wl.concurrency or 1)))

    runner = asyncio.create_task(drive())
    if watch is None:
        await runner
    else:
        while not runner.done():
            await asyncio.wait({runner}, timeout=0.2)
            if runner.done():
                break
            reason = watch(samples, list(inflight.values()), time.perf_counter())
            if reason:
                stopped = reason
                runner.cancel()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(runner, *tasks, return_exceptions=True)
                break
        if not runner.cancelled() and (exc := runner.exception()) is not None:
            raise exc
    end = max((s.start + (s.e2e or 0.0) for s in samples), default=t0)
    first = min((s.start for s in samples), default=t0)
    return samples, max(end - first, 1e-9), stopped


async def run_load(
    base_url: str,
    model: str,
    wl: Workload,
    *,
    tokenizer: Path | ServerTokenizer | None = None,
    progress: ProgressFn | None = None,
    max_inflight: int | None = None,
    scrape_metrics: bool = False,
    watch: Watcher | None = None,
    gauge_interval: float | None = None,
    reset_cache: bool = False,
    metric_names: MetricNames | None = None,
    reset_paths: Sequence[str] = (),
    request_fields: Mapping[str, Any] = IGNORE_EOS,
    wait_idle: bool = False,
) -> LoadResult:
    """Warm up, then measure.  ``max_inflight`` (rate mode) stops the
    measured phase early once that many requests wait at once; ``watch``
    may stop it for any reason of its own (pruning).  ``scrape_metrics``
    reads the server's counters before and after the measured phase (and its
    gauges every ``gauge_interval`` s during it, when given);
    ``reset_cache`` empties the server's prefix cache before the measured
    phase where the server offers that (``LoadResult.cache_reset``).  The
    engine's side comes from its adapter: ``metric_names`` (without them
    no counters are read), ``reset_paths`` (tried in order) and
    ``request_fields``, what every request carries for its fixed output
    length.  ``wait_idle``: first wait until the server holds no request
    (after a phase on it that ended early: ``prometheus.wait_idle``)."""
    path = "/v1/chat/completions" if wl.endpoint == "chat" else "/v1/completions"
    url = base_url.rstrip("/") + path
    # Reused connections must not outlive the server's idle timeout: aiohttp
    # reuses the oldest idle one first (15 s default) while uvicorn, as vLLM
    # and SGLang run it, closes it after 5 s, and a request sent as it closes
    # fails.  Read at call time so tests can scale it.
    idle_wait_s = None
    if wait_idle and metric_names is not None:
        from qtune.load.prometheus import wait_idle as idle

        idle_wait_s = await idle(base_url, metric_names)
    connector = aiohttp.TCPConnector(limit=0, force_close=False,
                                     keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm: list[RequestSample] = []
        w0 = time.perf_counter()
        if wl.warmup_requests:
            warm_source = await asyncio.to_thread(
                RequestSource, wl, tokenizer, seeds.warmup(wl.seed))
            warm, _, _ = await _phase(
                session, url, model, wl, warm_source, wl.warmup_requests,
                None, seeds.warmup(wl.arrivals_seed), "warm-up", progress, None,
                fields=request_fields,
            )
        warmup_s = time.perf_counter() - w0
        cache_reset = (await _reset_prefix_cache(session, base_url, reset_paths)
                       if reset_cache else None)
        watcher = None
        if scrape_metrics and metric_names is not None:
            from qtune.load.prometheus import MetricsWatcher

            watcher = MetricsWatcher(base_url, metric_names, gauge_interval)
            await watcher.start()
        try:
            source = await asyncio.to_thread(RequestSource, wl, tokenizer, wl.seed)
            lag = LoopLag()
            async with lag:
                samples, duration, stopped = await _phase(
                    session, url, model, wl, source, wl.requests, wl.duration,
                    wl.arrivals_seed, "measure", progress, max_inflight, watch,
                    fields=request_fields,
                )
            server = await watcher.stop() if watcher else None
        finally:
            if watcher is not None:
                await watcher.close()  # a cancelled phase: see MetricsWatcher.close
    return LoadResult(samples, duration, warm, stopped == "saturated", server, stopped,
                      warmup_s, cache_reset,
                      checks=sample_checks(samples, wl.endpoint), idle_wait_s=idle_wait_s,
                      client_lag=lag.summary())


class LoopLag:
    """How late the client's own event loop ran during the measured phase:
    a timer of ``TICK_S`` that wakes late says every timestamp taken then
    (first token, last token, the next send) was late by as much.  On the
    2-core CPU target, with vLLM's CPU server beside it at the same priority,
    the loop waited up to 2-5 s at a time for a core while using 7-14% of one
    (benchmarks/results/client-lag-cpu-20261207): the thread was runnable,
    not busy."""

    TICK_S = 0.05

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            self.lags.append(max(0.0, time.perf_counter() - t - self.TICK_S))

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def summary(self) -> dict[str, float] | None:
        """p99 and max lag in ms, and the seconds spent more than
        ``LAG_NOTED_MS`` late; None when the phase was too short to tell."""
        if not self.lags:
            return None
        ms = sorted(x * 1000 for x in self.lags)
        return {"p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
                "max": round(ms[-1], 1),
                "late_s": round(sum(x for x in self.lags if x * 1000 > LAG_NOTED_MS), 2)}


# A loop more than this late is said beside the figures (``bench.measure``):
# a quarter second is beyond a healthy loop's jitter (≤ 9 ms measured on the
# CPU target with the server niced) and large beside a TTFT limit.
LAG_NOTED_MS = 250.0


async def _reset_prefix_cache(session: aiohttp.ClientSession, base_url: str,
                              paths: Sequence[str]) -> bool:
    """Empty the server's prefix cache, if it offers a way (one of the
    engine's ``paths``, tried in order: the first 200 wins); True when done.
    Fresh prompts already keep a phase from hitting the cache; this also
    drops what a previous phase left, so the hit-rate check reads only the
    phase itself."""
    for path in paths:
        try:
            async with session.post(base_url.rstrip("/") + path, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status == 200:
                    return True
        except (aiohttp.ClientError, TimeoutError):
            continue
    return False
