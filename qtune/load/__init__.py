"""Load generator: drives a streaming workload against one base URL.

Knows nothing of engines or Optuna: it takes a URL, a served model name, a
``Workload`` and an optional tokenizer folder, and returns per-request
samples.  Warm-up requests run first, at the same arrival pattern, with
prompts from another seed; they finish before the measured phase starts, so
no warm-up request overlaps the measured window.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from qtune.load.client import RequestSample, build_body, send
from qtune.load.workload import PromptFactory, Workload

__all__ = ["LoadResult", "RequestSample", "Workload", "run_load"]


@dataclass
class LoadResult:
    samples: list[RequestSample]
    duration: float  # first measured send → last measured completion
    warmup: list[RequestSample]


ProgressFn = Callable[[str, int, int | None], None]


async def _phase(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    wl: Workload,
    prompts: PromptFactory,
    count: int | None,
    duration: float | None,
    seed: int,
    phase: str,
    progress: ProgressFn | None,
) -> tuple[list[RequestSample], float]:
    samples: list[RequestSample] = []
    t0 = time.perf_counter()
    stop_at = t0 + duration if duration else None

    def more(i: int) -> bool:
        if count is not None and i >= count:
            return False
        return stop_at is None or time.perf_counter() < stop_at

    async def one() -> None:
        text, n = prompts.prompt(wl.input_len)
        body = build_body(wl.endpoint, model, text, wl.output_len)
        s = await send(session, url, body, prompt_tokens=n)
        samples.append(s)
        if progress:
            progress(phase, len(samples), count)

    if wl.rate is not None:
        rng = random.Random(seed)
        tasks: list[asyncio.Task[None]] = []
        next_at = t0
        i = 0
        while more(i):
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if not more(i):
                break
            tasks.append(asyncio.create_task(one()))
            i += 1
            next_at += rng.expovariate(wl.rate)
        await asyncio.gather(*tasks)
    else:
        issued = 0

        async def worker() -> None:
            nonlocal issued
            while more(issued):
                issued += 1
                await one()

        await asyncio.gather(*(worker() for _ in range(wl.concurrency or 1)))
    end = max((s.start + (s.e2e or 0.0) for s in samples), default=t0)
    first = min((s.start for s in samples), default=t0)
    return samples, max(end - first, 1e-9)


async def run_load(
    base_url: str,
    model: str,
    wl: Workload,
    *,
    tokenizer: Path | None = None,
    progress: ProgressFn | None = None,
) -> LoadResult:
    path = "/v1/chat/completions" if wl.endpoint == "chat" else "/v1/completions"
    url = base_url.rstrip("/") + path
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm: list[RequestSample] = []
        if wl.warmup_requests:
            warm_prompts = PromptFactory(tokenizer, wl.seed + 1_000_003)
            warm, _ = await _phase(
                session, url, model, wl, warm_prompts, wl.warmup_requests,
                None, wl.seed + 1, "warm-up", progress,
            )
        prompts = PromptFactory(tokenizer, wl.seed)
        samples, duration = await _phase(
            session, url, model, wl, prompts, wl.requests, wl.duration,
            wl.seed, "measure", progress,
        )
    return LoadResult(samples, duration, warm)
