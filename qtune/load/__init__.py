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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from qtune.load.client import RequestSample, build_body, send
from qtune.load.workload import PromptFactory, Request, RequestSource, Workload

__all__ = [
    "LoadResult", "PromptFactory", "RequestSample", "Workload", "run_load",
]

# Requests prepared ahead for a phase bounded only by time; more are built
# (between sends) if a fast server drains them.
_POOL = 256


@dataclass
class LoadResult:
    samples: list[RequestSample]
    duration: float  # first measured send → last measured completion
    warmup: list[RequestSample]
    saturated: bool = False  # stopped early: in-flight requests piled up
    server: dict[str, Any] | None = None  # Prometheus view, when offered


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


async def _phase(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    wl: Workload,
    source: RequestSource,
    count: int | None,
    duration: float | None,
    seed: int,
    phase: str,
    progress: ProgressFn | None,
    max_inflight: int | None,
) -> tuple[list[RequestSample], float, bool]:
    ready: list[Request] = source.take(count if count is not None else _POOL)
    samples: list[RequestSample] = []
    inflight = 0
    saturated = False
    t0 = time.perf_counter()
    stop_at = t0 + duration if duration else None

    def more(i: int) -> bool:
        if saturated or (count is not None and i >= count):
            return False
        return stop_at is None or time.perf_counter() < stop_at

    def request(i: int) -> Request:
        while i >= len(ready):
            ready.append(source.next())
        return ready[i]

    async def one(req: Request) -> None:
        nonlocal inflight
        inflight += 1
        body = build_body(wl.endpoint, model, req.prompt, req.max_tokens)
        try:
            s = await send(session, url, body, prompt_tokens=req.prompt_tokens)
        finally:
            inflight -= 1
        samples.append(s)
        if progress:
            progress(phase, len(samples), count)

    if wl.rate is not None:
        gap = inter_arrivals(wl, random.Random(seed))
        tasks: list[asyncio.Task[None]] = []
        next_at = t0
        i = 0
        while more(i):
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if not more(i):
                break
            if max_inflight is not None and inflight >= max_inflight:
                # The server no longer keeps up: the backlog only grows, and
                # every further request measures the queue, not the config.
                saturated = True
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
    end = max((s.start + (s.e2e or 0.0) for s in samples), default=t0)
    first = min((s.start for s in samples), default=t0)
    return samples, max(end - first, 1e-9), saturated


async def run_load(
    base_url: str,
    model: str,
    wl: Workload,
    *,
    tokenizer: Path | None = None,
    progress: ProgressFn | None = None,
    max_inflight: int | None = None,
    scrape_metrics: bool = False,
) -> LoadResult:
    """Warm up, then measure.  ``max_inflight`` (rate mode) stops the
    measured phase early once that many requests wait at once."""
    path = "/v1/chat/completions" if wl.endpoint == "chat" else "/v1/completions"
    url = base_url.rstrip("/") + path
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm: list[RequestSample] = []
        if wl.warmup_requests:
            warm_source = RequestSource(wl, tokenizer, wl.seed + 1_000_003)
            warm, _, _ = await _phase(
                session, url, model, wl, warm_source, wl.warmup_requests,
                None, wl.seed + 1, "warm-up", progress, None,
            )
        watcher = None
        if scrape_metrics:
            from qtune.load.prometheus import MetricsWatcher

            watcher = MetricsWatcher(base_url)
            await watcher.start(session)
        source = RequestSource(wl, tokenizer, wl.seed)
        samples, duration, saturated = await _phase(
            session, url, model, wl, source, wl.requests, wl.duration,
            wl.seed, "measure", progress, max_inflight,
        )
        server = await watcher.stop(session) if watcher else None
    return LoadResult(samples, duration, warm, saturated, server)
