"""One engine with a queue: requests are served one at a time, each taking
SERVICE seconds, so latency explodes past 1/SERVICE req/s and capacity under
an SLO is known."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from tests.fakes.sse import Threaded

SERVICE = 0.01  # seconds per request, serialized: capacity ≈ 100 req/s


def queue_server() -> Threaded:
    """One engine with a queue: requests served one at a time, SERVICE s each."""
    lock = asyncio.Lock()  # bound to the server's loop at first use

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

    return Threaded({"GET /v1/models": models, "GET /metrics": metrics,
                     "POST /v1/completions": completions})
