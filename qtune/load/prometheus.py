"""Server-side view of a run from the engine's Prometheus ``/metrics``.

Scraped before, during (every ``interval`` s) and after the measured phase,
to report what explains the client-side numbers: preemptions (KV pressure),
peak KV-cache usage, the waiting-queue peak and the prefix-cache hit rate.
Names are vLLM's (engines.md §4.2), with the older aliases accepted.  An
endpoint without ``/metrics`` gives ``None``, never an error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# gauge name → aliases in older vLLM releases
_GAUGES = {
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",),
    "vllm:num_requests_waiting": (),
    "vllm:num_requests_running": (),
}
_COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
)


def parse(text: str) -> dict[str, float]:
    """Sum each sample name over its label sets (engines, models)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            # prometheus_client strips "_total" from counter family names but
            # keeps it on samples; index both forms under the bare name.
            if name.endswith("_total"):
                name = name[: -len("_total")]
            out[name] = out.get(name, 0.0) + float(s.value)
    return out


def _gauge(snap: dict[str, float], name: str) -> float | None:
    for n in (name, *_GAUGES.get(name, ())):
        if n in snap:
            return snap[n]
    return None


class MetricsWatcher:
    def __init__(self, base_url: str, interval: float = 1.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval = interval
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self.peaks: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def scrape(self, session: aiohttp.ClientSession) -> dict[str, float] | None:
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status != 200:
                    return None
                snap = parse(await r.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        if self.first is None:
            self.first = snap
        self.last = snap
        for g in _GAUGES:
            v = _gauge(snap, g)
            if v is not None:
                self.peaks[g] = max(self.peaks.get(g, v), v)
        return snap

    async def start(self, session: aiohttp.ClientSession) -> None:
        if await self.scrape(session) is None:
            return  # no /metrics here: stay silent

        async def loop() -> None:
            while True:
                await asyncio.sleep(self.interval)
                await self.scrape(session)

        self._task = asyncio.create_task(loop())

    async def stop(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        if self._task is None:
            return None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self.scrape(session)
        return self.report()

    def report(self) -> dict[str, Any] | None:
        if self.first is None or self.last is None:
            return None
        delta = {c: self.last.get(c, 0.0) - self.first.get(c, 0.0) for c in _COUNTERS}
        queries = delta["vllm:prefix_cache_queries"]
        return {
            "preemptions": int(delta["vllm:num_preemptions"]),
            "kv_cache_usage_peak": self.peaks.get("vllm:kv_cache_usage_perc"),
            "waiting_peak": self.peaks.get("vllm:num_requests_waiting"),
            "running_peak": self.peaks.get("vllm:num_requests_running"),
            "prefix_cache_hit_rate": (delta["vllm:prefix_cache_hits"] / queries
                                      if queries > 0 else None),
            "prompt_tokens": int(delta["vllm:prompt_tokens"]),
            "generation_tokens": int(delta["vllm:generation_tokens"]),
        }
