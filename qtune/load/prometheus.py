"""Server-side view of a run from the engine's Prometheus ``/metrics``.

Counters are read once before and once after the measured phase, which is
enough for everything they say: preemptions (KV pressure), prefix-cache hits
(the contamination check of a phase), prompt and generated tokens, finished
requests per engine.  The gauges (running, waiting, KV-cache use) only say
something while the load runs, so their peaks need scrapes during the phase;
those are off unless an ``interval`` is given, and then go over a connection
of their own, never one of the load's pooled connections.

Why not every second, as before: on the 2-core CPU target a once-a-second
scrape during the measured phase went with TTFT p99 stalls of 1-22 s (and 12
of 160 requests lost to ServerDisconnectedError) where the same load without
it saw 28-38 ms (shared/reference/measured.md).  ``benchmarks/server_view_ab.py``
measures the schemes against each other and against vLLM's own client.

The names are the engine's (``qtune.launch.MetricNames``, from its adapter),
with the older aliases it lists accepted.  An endpoint without ``/metrics``
gives ``None``, never an error.

A data-parallel server reports each engine under its own ``engine`` label.
Counts (requests, tokens) add up over engines; a fraction (KV-cache usage)
does not, so its peak is the fullest engine's.  With several engines the
report also gives each one's figures: one slow replica behind a balanced
front end shows only there.  It shows as a queue, not as fewer tokens: the
front end splits requests by arrival and every one finishes, so over a run
each engine generates the same; the slow one holds more requests at once
(2xH200: 142 against 52 running in the start whose p99 was 2.7 times the
others', 47 against 49 in a normal one).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from qtune.launch import MetricNames
from qtune.load.http import read_capped
from qtune.metrics import spec_acceptance

# engine_peaks key of the per-engine peak of running + waiting requests
_HELD = "held"

# sample name → engine label ("" where there is none) → value
Snapshot = dict[str, dict[str, float]]


def parse(text: str, engine_label: str = "engine") -> Snapshot:
    """Each sample name's value per engine (``engine_label``), summed over
    other labels (models)."""
    out: Snapshot = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            # prometheus_client strips "_total" from counter family names but
            # keeps it on samples; index both forms under the bare name.
            if name.endswith("_total"):
                name = name[: -len("_total")]
            per = out.setdefault(name, {})
            engine = s.labels.get(engine_label, "")
            per[engine] = per.get(engine, 0.0) + float(s.value)
    return out


def _gauge(snap: Snapshot, name: str | None,
           names: MetricNames) -> dict[str, float] | None:
    if name is None:
        return None
    for n in (name, *names.aliases.get(name, ())):
        if n in snap:
            return snap[n]
    return None


def _combine(name: str, per_engine: dict[str, float], names: MetricNames) -> float:
    # A fraction (KV-cache use) is per engine: never summed.
    return (max(per_engine.values()) if name == names.kv_cache_usage
            else sum(per_engine.values()))


def _held(snap: Snapshot, names: MetricNames) -> dict[str, float]:
    """Requests each engine holds, running or waiting, at one scrape."""
    run = _gauge(snap, names.requests_running, names) or {}
    wait = _gauge(snap, names.requests_waiting, names) or {}
    return {e: run.get(e, 0.0) + wait.get(e, 0.0) for e in run.keys() | wait.keys()}


class MetricsWatcher:
    """``interval`` None: counters only (before and after the phase); else
    also the gauges every ``interval`` seconds during it."""

    def __init__(self, base_url: str, names: MetricNames,
                 interval: float | None = None) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.names = names
        self.interval = interval
        self.scrapes = 0
        self._session: aiohttp.ClientSession | None = None
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None
        self.peaks: dict[str, float] = {}
        self.engine_peaks: dict[str, dict[str, float]] = {}  # gauge → engine → peak
        self._task: asyncio.Task[None] | None = None

    async def scrape(self, session: aiohttp.ClientSession,
                     during: bool = True) -> Snapshot | None:
        """One read; ``during`` the phase its gauges count towards the
        peaks (before or after it they read an idle server)."""
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=5),
                                   allow_redirects=False) as r:
                if r.status != 200:
                    return None
                body = await read_capped(r)
                snap = parse(body.decode("utf-8", "replace"), self.names.engine_label)
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError, ArithmeticError):
            return None
        self.scrapes += 1
        if self.first is None:
            self.first = snap
        self.last = snap
        if not during:
            return snap
        names = self.names
        for g in names.gauges:
            per = _gauge(snap, g, names)
            if not per:
                continue
            v = _combine(g, per, names)
            self.peaks[g] = max(self.peaks.get(g, v), v)
            ep = self.engine_peaks.setdefault(g, {})
            for e, x in per.items():
                ep[e] = max(ep.get(e, x), x)
        # Requests each engine holds, running or waiting, at one scrape: with
        # a small max_num_seqs every engine runs at the cap and a slow one's
        # backlog waits, so running alone would read as even.
        held = self.engine_peaks.setdefault(_HELD, {})
        for e, x in _held(snap, names).items():
            held[e] = max(held.get(e, x), x)
        return snap

    async def start(self) -> None:
        # A connection of its own, closed after each scrape: a scrape never
        # waits behind (or holds up) one of the load's streams.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True))
        if await self.scrape(self._session, during=False) is None:
            await self._session.close()
            self._session = None
            return  # no /metrics here: stay silent
        if self.interval is None:
            return
        session, interval = self._session, self.interval

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                await self.scrape(session)

        self._task = asyncio.create_task(loop())

    async def stop(self) -> dict[str, Any] | None:
        if self._session is None:
            return None
        await self._end_loop()
        await self.scrape(self._session, during=False)
        await self.close()
        return self.report()

    async def _end_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def close(self) -> None:
        """Stop scraping and close the connection without a last scrape:
        what a measured phase that was cancelled (an interrupted study) does,
        so no session is left for the garbage collector to warn about
        ("Unclosed client session" after "interrupted: servers stopped")."""
        await self._end_loop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def report(self) -> dict[str, Any] | None:
        if self.first is None or self.last is None:
            return None
        first, last, n = self.first, self.last, self.names

        def delta(c: str | None, engine: str | None = None) -> float:
            if c is None:
                return 0.0
            a, b = first.get(c, {}), last.get(c, {})
            keys = b.keys() if engine is None else [engine]
            return sum(b.get(e, 0.0) - a.get(e, 0.0) for e in keys)

        queries = delta(n.prefix_cache_queries)
        out: dict[str, Any] = {
            "scrapes": self.scrapes,
            "gauge_interval_s": self.interval,
            "preemptions": int(delta(n.preemptions)) if n.preemptions else None,
            "kv_cache_usage_peak": self.peaks.get(n.kv_cache_usage or ""),
            "waiting_peak": self.peaks.get(n.requests_waiting or ""),
            "running_peak": self.peaks.get(n.requests_running or ""),
            "prefix_cache_hit_rate": (delta(n.prefix_cache_hits) / queries
                                      if queries > 0 else None),
            "prefix_cache_queries": int(queries) if n.prefix_cache_queries else None,
            "prompt_tokens": int(delta(n.prompt_tokens)) if n.prompt_tokens else None,
            "generation_tokens": (int(delta(n.generation_tokens))
                                  if n.generation_tokens else None),
        }
        spec = spec_acceptance(delta(n.spec_drafts), delta(n.spec_draft_tokens),
                               delta(n.spec_accepted_tokens))
        if spec is not None:  # only a server that drafted: other views unchanged
            out["spec_decode"] = spec
        engines = sorted(last.get(n.generation_tokens or "", {}), key=_engine_order)
        if len(engines) > 1:
            peaks = self.engine_peaks
            out["engines"] = [{
                "engine": e,
                "requests": int(delta(n.request_success, e)),
                "prompt_tokens": int(delta(n.prompt_tokens, e)),
                "generation_tokens": int(delta(n.generation_tokens, e)),
                "preemptions": int(delta(n.preemptions, e)) if n.preemptions else None,
                "running_peak": peaks.get(n.requests_running or "", {}).get(e),
                "held_peak": peaks.get(_HELD, {}).get(e),
                "kv_cache_usage_peak": peaks.get(n.kv_cache_usage or "", {}).get(e),
            } for e in engines]
            held = [r["held_peak"] for r in out["engines"]]
            # Least loaded replica's peak against the busiest's: 1.0 is even.
            out["held_balance"] = (min(held) / max(held)
                                   if None not in held and max(held) > 0 else None)
        return out


def _engine_order(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


# How long a phase waits for the server to finish what an earlier phase left
# (a probe stopped early, a pile-up) before it starts anyway.
IDLE_TIMEOUT_S = 180.0
IDLE_POLL_S = 0.5


async def wait_idle(base_url: str, names: MetricNames,
                    timeout: float = IDLE_TIMEOUT_S) -> float | None:
    """Wait until the server holds no request (running and waiting gauges at
    0); the seconds waited, or None when its gauges cannot be read.  A probe
    stopped once its failure was certain leaves its requests on the server,
    and a probe started beside them measures them: on 2 CPU cores, after an
    overload probe stopped early, eleven later probes down to a third of the
    load that had held failed one after another (the full procedure, which
    never stops a probe, held 13 req/s; the fast one found 5).  Only after a
    phase that ended early (``run_load(wait_idle=True)``): SGLang refreshes
    its gauges on an idle server only every 30 s, and a server qtune did not
    start may never be idle."""
    if names.requests_running is None:
        return None
    reader = MetricsWatcher(base_url, names)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        while True:
            snap = await reader.scrape(s, during=False)
            if snap is None:
                return None
            held = sum(_held(snap, names).values())
            if not math.isfinite(held):
                return None  # a NaN or infinite gauge says nothing
            waited = time.monotonic() - t0
            if held <= 0 or waited >= timeout:
                return waited
            await asyncio.sleep(IDLE_POLL_S)
