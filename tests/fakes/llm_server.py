"""A stand-in OpenAI streaming server for orchestration tests (not vLLM):
python -m tests.fakes.llm_server PORT NAME [--delay-ms N] [--crash] [--port N]
    [--logprob-shift X] [--slots N]

Each request streams ``max_tokens`` tokens, one per ``delay-ms``.  With
--crash it prints a root cause and exits at start, like a config vLLM
refuses.  A request without ``stream`` gets one JSON answer, as the quality
gate asks: with ``prompt_logprobs``, every word after the first at
log-probability -1 - X (vLLM's shape); else ``max_tokens`` words, "t" or,
with a shift, "u" (another greedy output).  With --slots N at most N streams
run at once and the rest wait (a batch limit: a capacity of N / (tokens x
delay) requests per second).
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web


def main() -> None:
    port, name, *opts = sys.argv[1:]
    delay = float(opts[opts.index("--delay-ms") + 1]) / 1000 if "--delay-ms" in opts else 0.001
    shift = float(opts[opts.index("--logprob-shift") + 1]) \
        if "--logprob-shift" in opts else 0.0
    if "--port" in opts:  # verify rewrites the --port flag, not the first argument
        port = opts[opts.index("--port") + 1]
    slots = asyncio.Semaphore(int(opts[opts.index("--slots") + 1])) \
        if "--slots" in opts else None
    if "--crash" in opts:
        print("ValueError: fake engine refuses --crash (No available memory for the "
              "cache blocks)", flush=True)
        sys.exit(1)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": name}]})

    async def completions(request: web.Request) -> web.StreamResponse | web.Response:
        body = await request.json()
        if not body.get("stream"):
            choice: dict[str, object] = {
                "index": 0, "text": (" u" if shift else " t") * body["max_tokens"]}
            if "prompt_logprobs" in body:
                words = body["prompt"].split()
                choice["prompt_logprobs"] = [None] + [
                    {str(i): {"logprob": -1.0 - shift, "rank": 1}}
                    for i in range(1, len(words))]
            return web.json_response({"choices": [choice]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if slots is not None:
            async with slots:
                await stream(resp, body)
        else:
            await stream(resp, body)
        return resp

    async def stream(resp: web.StreamResponse, body: dict[str, object]) -> None:
        for _ in range(int(body["max_tokens"])):  # type: ignore[call-overload]
            await asyncio.sleep(delay)
            await resp.write(b"data: " + json.dumps(
                {"choices": [{"index": 0, "text": " t"}]}).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {
            "prompt_tokens": 8, "completion_tokens": body["max_tokens"]}}).encode()
            + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    print("serving", flush=True)
    web.run_app(app, host="127.0.0.1", port=int(port), print=None)


if __name__ == "__main__":
    main()
