"""Tiny in-process SSE servers for the load-generator tests.

Each test builds an ``aiohttp.web`` handler that writes exactly the bytes it
wants (split wherever it wants, with whatever delays), serves it on
127.0.0.1 port 0 and tears it down again, all inside one ``asyncio.run``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """Serve ``handler`` on both OpenAI streaming paths; yield the base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    # Short shutdown: a handler left waiting must not hold the test up.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text(t: str) -> bytes:
    return event({"choices": [{"index": 0, "text": t, "finish_reason": None}]})


def usage(completion: int, prompt: int = 5) -> bytes:
    return event(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


DONE = b"data: [DONE]\n\n"


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


now = time.perf_counter
