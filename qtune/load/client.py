"""One streaming request against an OpenAI-compatible server.

Timing follows ``vllm bench serve`` so the two can be compared: timestamps
are ``time.perf_counter()`` at the arrival of each SSE chunk carrying text
(vLLM's client also times chunks whose text is empty, such as a token that
ends mid-UTF-8 character; with one token per chunk, as vLLM streams, the two
coincide, and benchmarks/fidelity_vs_vllm_bench.py prints chunks per token to
catch the difference);
TTFT = first such chunk − send; ITL = gaps between such chunks; E2E = last
such chunk − send (the trailing usage-only chunk is excluded); output tokens
come from the server's ``usage`` when it reports one.

A request never raises: every failure (connection refused, HTTP 429/503,
an error object mid-stream, a timeout) becomes a sample with ``error`` set.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError


@dataclass(slots=True)
class RequestSample:
    start: float = 0.0  # perf_counter at send
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    expected_output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def truncated(self) -> bool:
        return self.ok and self.output_tokens < self.expected_output_tokens


def build_body(
    endpoint: str, model: str, prompt: str, max_tokens: int
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        # Fixed output length: the load must not depend on what random
        # weights happen to generate.
        "ignore_eos": True,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _delta_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    prompt_tokens: int,
    timeout: float = 600.0,
    sample: RequestSample | None = None,
) -> RequestSample:
    """``sample``, when given, is filled in place, so a watcher can see a
    request's progress (start, first token) while it is in flight."""
    s = sample if sample is not None else RequestSample()
    s.prompt_tokens = prompt_tokens
    s.expected_output_tokens = body["max_tokens"]
    chunks = 0
    last = 0.0
    s.start = time.perf_counter()
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status != 200:
                # errors="replace": a proxy's binary error page must not raise.
                text = (await resp.text(errors="replace"))[:200].replace("\n", " ")
                s.error = f"HTTP {resp.status}: {text}"
                return s
            # aiohttp yields whole lines even when a TCP read split an event.
            async for raw in resp.content:
                line = raw.strip()
                if not line or not line.startswith(b"data:"):
                    continue  # SSE comments, keep-alives, "event:" lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    break  # some servers keep the connection open after it
                now = time.perf_counter()
                try:
                    event = json.loads(data)
                    if not isinstance(event, dict):
                        raise TypeError("not a JSON object")
                    if "error" in event:
                        err = event["error"]
                        msg = err.get("message") if isinstance(err, dict) else err
                        s.error = f"server error mid-stream: {msg}"
                        return s
                    choices = event.get("choices") or []
                    has_text = bool(choices) and bool(_delta_text(choices[0]))
                    usage = event.get("usage")
                    if usage:
                        s.output_tokens = int(usage.get("completion_tokens") or 0)
                        s.prompt_tokens = int(
                            usage.get("prompt_tokens") or prompt_tokens
                        )
                except (ValueError, TypeError, AttributeError):
                    # Not JSON, or JSON of another shape ([...], null, a
                    # string, choices that are not objects): a failed
                    # request, never an exception out of send().
                    s.error = f"bad SSE payload: {data[:80]!r}"
                    return s
                if has_text:
                    if s.ttft is None:
                        s.ttft = now - s.start
                    else:
                        s.itl.append(now - last)
                    last = now
                    chunks += 1
    except TimeoutError:
        s.error = f"timeout after {timeout:.0f} s"
        return s
    except (aiohttp.ClientError, HttpProcessingError) as exc:
        # HttpProcessingError: LineTooLong, an SSE line over aiohttp's
        # read limit (512 KiB by default); it is not a ClientError.
        s.error = f"{type(exc).__name__}: {exc}"[:200]
        return s
    if s.ttft is None:
        s.error = "no tokens received"
        return s
    s.e2e = last - s.start
    if s.output_tokens == 0:
        # No usage report: one chunk is one token for vLLM with
        # stream_interval 1; other servers may batch, so this is a floor.
        s.output_tokens = chunks
    return s
