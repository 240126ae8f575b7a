"""Tiny in-process SSE servers for the load-generator and bench tests.

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
async def serve(
    handler: Handler, extra: dict[str, Handler] | None = None,
    get: dict[str, Handler] | None = None,
) -> AsyncIterator[str]:
    """Serve ``handler`` on both OpenAI streaming paths (and ``extra`` POST
    routes, e.g. ``/tokenize``, and ``get`` GET routes, e.g. ``/metrics``);
    yield the base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    for path, h in (extra or {}).items():
        app.router.add_post(path, h)
    for path, h in (get or {}).items():
        app.router.add_get(path, h)
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


def stalling(after: int, hold: float = 5.0) -> Handler:
    """A handler that sends ``after`` text chunks, then nothing (the
    connection stays open) for ``hold`` seconds: a server stuck mid-stream."""
    import asyncio

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for i in range(after):
            await resp.write(text(f"t{i} "))
        try:
            await asyncio.sleep(hold)
        except asyncio.CancelledError:
            pass  # the runner's shutdown, or the client hung up
        return resp

    return handler


def with_usage(raw_usage: Any, tokens: int = 3) -> Handler:
    """A handler that streams ``tokens`` text chunks and then reports
    ``raw_usage`` as its usage object, whatever it holds."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for i in range(tokens):
            await resp.write(text(f"t{i} "))
        await resp.write(event({"choices": [], "usage": raw_usage}) + DONE)
        return resp

    return handler


def bpe_tokenizer(dest: Any) -> Any:
    """A small byte-level BPE (500 ids) trained on varied English, saved as
    ``dest/tokenizer.json``: words split into several tokens, as in a real
    model's vocabulary, so a prompt of N words is not N tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo "
             "lima mike november oscar papa quebec romeo sierra tango uniform "
             "victor whiskey xray yankee zulu "
             "measure latency throughput memory bandwidth queue").split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12))
              for i in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    return tok


class CountingServer:
    """vLLM's counting, in miniature: ``usage.prompt_tokens`` is the prompt's
    length in ``tok`` plus ``bos`` (a BOS token), and ``/tokenize`` and
    ``/detokenize`` answer as vLLM's do (``{"tokens", "count"}``,
    ``{"prompt"}``).  Records every prompt count it served."""

    def __init__(self, tok: Any, bos: int = 1, tokenize: bool = True) -> None:
        self.tok, self.bos, self.tokenize_on = tok, bos, tokenize
        self.counts: list[int] = []
        self.tokenize_calls = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(self.tok.encode(body["prompt"], add_special_tokens=False).ids) + self.bos
        self.counts.append(n)
        resp = await open_stream(request)
        for i in range(body["max_tokens"]):
            await resp.write(text(f"t{i} "))
        await resp.write(usage(body["max_tokens"], n) + DONE)
        return resp

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        self.tokenize_calls += 1
        if not self.tokenize_on:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = await request.json()
        ids = self.tok.encode(body["prompt"],
                              add_special_tokens=body.get("add_special_tokens", True)).ids
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 4096})

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        if not self.tokenize_on:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = await request.json()
        return web.json_response({"prompt": self.tok.decode(body["tokens"])})

    def routes(self) -> dict[str, Handler]:
        return {"/tokenize": self.tokenize, "/detokenize": self.detokenize}


class Threaded:
    """An aiohttp app on a thread of its own, for code that runs its own
    event loop (``run_bench``, the CLI in a subprocess): ``with
    Threaded(routes) as url``.  ``routes`` maps "GET /path" or "POST /path"
    to a handler."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        import asyncio
        import threading

        self.routes = routes
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self.loop)
        app = web.Application()
        for key, h in self.routes.items():
            method, path = key.split(" ", 1)
            app.router.add_route(method, path, h)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> str:
        self.thread.start()
        self.ready.wait(10)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
