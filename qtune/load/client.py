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
an error object mid-stream, a timeout, a stalled stream) becomes a sample
with ``error`` set, its reason first ("timeout: ...", "stalled: ...",
"HTTP 503: ...", "ServerDisconnectedError: ...") so failures group by it.

A server's ``usage`` is checked before it is believed: counts that are not
whole numbers, are negative, exceed ``max_tokens`` or exceed what the prompt's
bytes could encode are recorded in ``usage_problem`` and the client's own
counts are used instead (a server once reported negative completion tokens,
and output tok/s came out negative).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from qtune.errors import redact
from qtune.launch import IGNORE_EOS
from qtune.untrusted import loads


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
    # The prompt length asked for (None: a dataset prompt nobody counted).
    requested_prompt_tokens: int | None = None
    # The server's usage.prompt_tokens, when reported and believable.
    server_prompt_tokens: int | None = None
    # Why the server's usage was not believed (the counts above are then
    # the client's own: its prompt count, and text chunks for the output).
    usage_problem: str | None = None
    # Why the first send failed before any answer, when it was sent again.
    resent: str | None = None

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
    endpoint: str, model: str, prompt: str, max_tokens: int,
    fixed_length: Mapping[str, Any] = IGNORE_EOS,
) -> dict[str, Any]:
    """One streamed request; ``fixed_length`` are the fields by which the
    server generates exactly ``max_tokens`` (the engine's, ``IGNORE_EOS`` by
    default): the load must not depend on what the weights happen to say."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        **fixed_length,
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


# A chat template adds its own tokens around the message (Qwen's about 10,
# Llama 3's system preamble about 25): allowed on top of the prompt's length
# before a chat run's prompt lengths count as wrong.
CHAT_TEMPLATE_ALLOWANCE = 64
# Server prompt counts more than this far from the requested lengths (on
# average, relative) make the run's workload not the one asked for.  One token
# is always allowed: a BOS the tokenizer adds.
LENGTH_TOLERANCE = 0.05
# Tokens a prompt of B UTF-8 bytes can hold: at most one a byte (byte-level
# BPE; SentencePiece's byte fallback), twice for margin, plus a template.
_MAX_TOKENS_PER_BYTE = 2
_TEMPLATE_TOKENS = 1024


def _prompt_bytes(body: dict[str, Any]) -> int:
    if "prompt" in body:
        return len(str(body["prompt"]).encode())
    return sum(len(str(m.get("content", "")).encode()) for m in body.get("messages", []))


def usage_problem(
    usage: dict[str, Any], max_tokens: int, prompt_bytes: int
) -> str | None:
    """Why ``usage`` cannot be right, or None."""
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            return f"usage.{key}={v!r} is not a whole number"
        if v < 0:
            return f"usage.{key}={v} is negative"
    out = usage.get("completion_tokens")
    if out is not None and out > max_tokens:
        # max_tokens is a hard cap in the OpenAI API.
        return f"usage.completion_tokens={out} is above max_tokens={max_tokens}"
    p = usage.get("prompt_tokens")
    limit = _MAX_TOKENS_PER_BYTE * prompt_bytes + _TEMPLATE_TOKENS
    if p is not None and p > limit:
        return (f"usage.prompt_tokens={p} is more than a {prompt_bytes}-byte "
                f"prompt can hold")
    return None


# A request that failed so before any byte of its answer may never have been
# read by the server (a connection it had closed): sent once more (``send``).
NEVER_READ = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# What ends a request as failed: a timeout, a transport error, or a stream
# aiohttp cannot read.  An SSE line over aiohttp's read limit (512 KiB by
# default) raises LineTooLong (an HttpProcessingError, not a ClientError)
# since aiohttp 3.13 and ValueError("Chunk too big") before (3.9-3.12, the
# floor's): the JSON of an event is judged inside the loop, so a ValueError
# here is the stream's.
_FAILED = (TimeoutError, aiohttp.ClientError, HttpProcessingError, ValueError)


@dataclass(slots=True)
class _Stream:
    """One attempt's progress through a streamed answer."""

    answered: bool = False  # the response's headers arrived
    stalled: bool = False  # the stall timer, not the total, ran out
    chunks: int = 0
    last: float = 0.0
    usage: dict[str, Any] | None = None


def _failure(exc: BaseException, state: _Stream, timeout: float, stall_timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return (f"stalled: no data for {stall_timeout:g} s" if state.stalled
                else f"timeout: request over {timeout:g} s")
    # redact(): aiohttp names the URL, which may carry a password.
    return redact(f"{type(exc).__name__}: {exc}")[:200]


async def _attempt(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                   s: RequestSample, state: _Stream, timeout: float,
                   stall_timeout: float) -> None:
    """Send ``body`` once and read its stream into ``s`` and ``state``; a
    failed answer sets ``s.error``; a transport failure or timeout raises."""
    loop = asyncio.get_running_loop()
    stall = asyncio.timeout(None)
    try:
        async with stall:
            async with session.post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,  # never re-send credentials elsewhere
            ) as resp:
                state.answered = True
                if resp.status != 200:
                    # The first 2 KB only (an error page may be huge);
                    # errors="replace": a proxy's binary page must not raise.
                    head = await resp.content.read(2048)
                    text = head.decode("utf-8", "replace")[:200].replace("\n", " ")
                    s.error = redact(f"HTTP {resp.status}: {text}")
                    return
                # aiohttp yields whole lines even when a TCP read split an event.
                async for raw in resp.content:
                    # One timer, moved on each read: cheaper than a
                    # wait_for per line on the hot path.
                    stall.reschedule(loop.time() + stall_timeout)
                    line = raw.strip()
                    if not line or not line.startswith(b"data:"):
                        continue  # SSE comments, keep-alives, "event:" lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break  # some servers keep the connection open after it
                    now = time.perf_counter()
                    try:
                        event = loads(data, "SSE event")
                        if not isinstance(event, dict):
                            raise TypeError("not a JSON object")
                        if "error" in event:
                            err = event["error"]
                            msg = err.get("message") if isinstance(err, dict) else err
                            s.error = redact(f"server error mid-stream: {msg}")
                            return
                        choices = event.get("choices") or []
                        if not isinstance(choices, list):
                            raise TypeError("choices is not a list")
                        has_text = bool(choices) and bool(_delta_text(choices[0]))
                        usage = event.get("usage")
                        if usage:
                            if not isinstance(usage, dict):
                                raise TypeError("usage is not an object")
                            state.usage = usage  # running counts: keep the last
                    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
                        # Not JSON, or JSON of another shape ([...], null, a
                        # string, choices that are not objects): a failed
                        # request, never an exception out of send().
                        s.error = f"bad SSE payload: {data[:80]!r}"
                        return
                    if has_text:
                        if s.ttft is None:
                            s.ttft = now - s.start
                        else:
                            s.itl.append(now - state.last)
                        state.last = now
                        state.chunks += 1
    except TimeoutError:
        state.stalled = stall.expired()
        raise


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    prompt_tokens: int,
    timeout: float = 600.0,
    stall_timeout: float = 60.0,
    sample: RequestSample | None = None,
) -> RequestSample:
    """``sample``, when given, is filled in place, so a watcher can see a
    request's progress (start, first token) while it is in flight.

    ``timeout`` bounds the whole request; ``stall_timeout`` the silence
    between two reads of the body once it has started.  Before the first
    byte only ``timeout`` applies: vLLM sends nothing until the first token,
    which may follow a long queue and prefill."""
    s = sample if sample is not None else RequestSample()
    s.prompt_tokens = prompt_tokens
    s.expected_output_tokens = body["max_tokens"]
    s.start = time.perf_counter()
    state = _Stream()
    try:
        await _attempt(session, url, body, s, state, timeout, stall_timeout)
    except NEVER_READ as exc:
        if state.answered:
            s.error = _failure(exc, state, timeout, stall_timeout)
            return s
        # No byte of an answer: the request went out on a connection the
        # server had already closed (a keep-alive race: on the 2-core CPU
        # target the client's loop ran up to 8 s late, so a connection it
        # thought idle for 2 s the server had idled past its 5 s and closed;
        # benchmarks/results/client-lag-cpu-20261207).  Sent once more, on
        # a connection of its own; its wait counts in its latency, and the
        # run says how many were sent again (sample_checks: "resent").
        s.resent = _failure(exc, state, timeout, stall_timeout)
        state = _Stream()
        try:
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                await _attempt(fresh, url, body, s, state, timeout, stall_timeout)
        except _FAILED as exc2:
            s.error = _failure(exc2, state, timeout, stall_timeout)
            return s
    except _FAILED as exc:
        s.error = _failure(exc, state, timeout, stall_timeout)
        return s
    if s.error is not None:
        return s
    chunks, last, usage_seen = state.chunks, state.last, state.usage
    if s.ttft is None:
        s.error = "no tokens received"
        return s
    s.e2e = last - s.start
    if usage_seen is not None:
        problem = usage_problem(usage_seen, body["max_tokens"], _prompt_bytes(body))
        if problem is not None:
            s.usage_problem = problem
        else:
            s.output_tokens = int(usage_seen.get("completion_tokens") or 0)
            # 0 for a prompt that reached the model: a server that does not
            # count (as before, the client's count stands).
            if usage_seen.get("prompt_tokens"):
                s.server_prompt_tokens = int(usage_seen["prompt_tokens"])
                s.prompt_tokens = s.server_prompt_tokens
    if s.output_tokens == 0:
        # No (believable) usage: one chunk is one token for vLLM with
        # stream_interval 1; other servers may batch, so this is a floor.
        s.output_tokens = chunks
    return s


def sample_checks(samples: list[RequestSample], endpoint: str) -> dict[str, Any]:
    """What a run's summary must say about its own trustworthiness: usage
    counts not believed, prompt lengths that are not the ones asked for, and
    requests sent a second time (``resent``).

    ``prompt_length`` compares the server's ``usage.prompt_tokens`` with the
    requested lengths over the requests that have both; ``length_mismatch``
    (server mean / requested mean - 1) is set only when they differ by more
    than ``LENGTH_TOLERANCE`` (and a BOS token, and a chat template)."""
    out: dict[str, Any] = {}
    ok = [s for s in samples if s.ok]
    problems: dict[str, int] = {}
    for s in ok:
        if s.usage_problem:
            key = s.usage_problem.split("=")[0]  # "usage.completion_tokens"
            problems[key] = problems.get(key, 0) + 1
    if problems:
        first = next(s.usage_problem for s in ok if s.usage_problem)
        out["usage_distrusted"] = {"requests": sum(problems.values()),
                                   "by_field": problems, "example": first}
    resent = [s.resent for s in samples if s.resent]
    if resent:  # sent again after a failure before any answer (``send``)
        out["resent"] = {"requests": len(resent), "example": resent[0]}
    pairs = [(s.requested_prompt_tokens, s.server_prompt_tokens) for s in ok
             if s.requested_prompt_tokens and s.server_prompt_tokens is not None]
    if pairs:
        req = sum(p[0] for p in pairs) / len(pairs)
        srv = sum(p[1] for p in pairs) / len(pairs)
        allowed = max(LENGTH_TOLERANCE * req, 1.0) + (
            CHAT_TEMPLATE_ALLOWANCE if endpoint == "chat" else 0)
        out["prompt_length"] = {"requests": len(pairs), "requested_mean": req,
                                "server_mean": srv, "allowed_difference": allowed}
        if abs(srv - req) > allowed:
            out["length_mismatch"] = srv / req - 1.0
    return out
