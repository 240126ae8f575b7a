"""SSE edge cases for ``qtune.load.client.send`` against in-process servers.

Timing is measured on the same event loop as the server, so controlled
server-side sleeps give lower bounds that are exact and upper bounds that
only need slack for scheduling noise.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from qtune.load.client import RequestSample, build_body, send
from tests.fakes.sse import (
    DONE,
    event,
    free_port,
    now,
    open_stream,
    serve,
    stalling,
    text,
    usage,
    with_usage,
)

GAP = 0.030  # server-side pause between text chunks
SLACK = 0.060  # scheduling noise allowed above a controlled delay


async def _send(
    base: str,
    *,
    endpoint: str = "completions",
    max_tokens: int = 8,
    timeout: float = 5.0,
) -> tuple[RequestSample, float]:
    """One ``send``; also returns its wall time."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = build_body(endpoint, "m", "hello there", max_tokens)
    async with aiohttp.ClientSession() as session:
        t0 = now()
        s = await send(session, base + path, body, prompt_tokens=3, timeout=timeout)
        return s, now() - t0


def run_with(handler: Any, **kw: Any) -> tuple[RequestSample, float]:
    async def main() -> tuple[RequestSample, float]:
        async with serve(handler) as base:
            return await _send(base, **kw)

    return asyncio.run(main())


def assert_e2e_is_ttft_plus_itl(s: RequestSample) -> None:
    assert s.ttft is not None and s.e2e is not None
    assert s.e2e == pytest.approx(s.ttft + sum(s.itl), abs=1e-9)


# --- framing ---------------------------------------------------------------


def test_events_split_across_writes_mid_line_and_mid_json():
    pieces = [
        b"da",
        b'ta: {"choices": [{"index": 0, "te',
        b'xt": "Hel',
        b'lo", "finish_reason": null}]}\n',
        b"\n",
        b'data: {"choices": [{"index": 0, "text": " wor',
        b'ld"}]}\r\n\r',  # CRLF line endings, split between CR and LF
        b"\n",
        b"data: [DO",
        b"NE]\n\n",
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for p in pieces:
            await resp.write(p)
            await asyncio.sleep(0.005)  # separate TCP segments
        return resp

    s, _ = run_with(handler)
    assert s.ok, s.error
    assert s.output_tokens == 2  # no usage: one per text chunk
    assert len(s.itl) == 1
    assert_e2e_is_ttft_plus_itl(s)


def test_several_events_in_one_write():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await asyncio.sleep(0.02)
        await resp.write(b"".join(text(c) for c in "abcde") + usage(5) + DONE)
        return resp

    s, _ = run_with(handler)
    assert s.ok, s.error
    assert s.output_tokens == 5
    assert len(s.itl) == 4
    assert all(x < 0.005 for x in s.itl)  # same read: no real gap
    assert s.ttft is not None and s.ttft >= 0.02


# --- what counts as a token ------------------------------------------------


def test_empty_text_deltas_are_not_tokens():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text(""))  # immediately: must not set TTFT
        await resp.write(event({"choices": [{"index": 0, "text": None}]}))
        await asyncio.sleep(0.05)
        await resp.write(text("a"))
        await asyncio.sleep(GAP)
        await resp.write(text(""))  # must not split the gap in two
        await asyncio.sleep(GAP)
        await resp.write(text("b"))
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler)
    assert s.ok, s.error
    assert s.ttft is not None and s.ttft >= 0.05
    assert s.output_tokens == 2
    assert len(s.itl) == 1
    assert 2 * GAP - 0.002 <= s.itl[0] <= 2 * GAP + SLACK
    assert_e2e_is_ttft_plus_itl(s)


def test_timing_and_usage_only_final_chunk():
    """TTFT/ITL/E2E from controlled delays; tokens from usage; E2E ends at the
    last text chunk, not at the late usage-only chunk."""
    first_delay, n_text, tail = 0.05, 5, 0.10

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await asyncio.sleep(first_delay)
        for i in range(n_text):
            if i:
                await asyncio.sleep(GAP)
            await resp.write(text(f"w{i} "))
        await asyncio.sleep(tail)
        await resp.write(usage(completion=7, prompt=11))  # choices == []
        await resp.write(DONE)
        return resp

    s, wall = run_with(handler, max_tokens=7)
    assert s.ok, s.error
    assert s.output_tokens == 7  # from usage, not the 5 text chunks
    assert s.prompt_tokens == 11  # the server's count wins
    assert s.ttft is not None and s.e2e is not None
    assert first_delay - 0.002 <= s.ttft <= first_delay + SLACK
    assert len(s.itl) == n_text - 1
    for x in s.itl:
        assert GAP - 0.002 <= x <= GAP + SLACK
    assert_e2e_is_ttft_plus_itl(s)
    # The usage chunk came `tail` seconds after the last text: E2E excludes it.
    assert wall >= s.e2e + tail - 0.002
    assert s.tpot == pytest.approx((s.e2e - s.ttft) / (7 - 1))
    assert s.expected_output_tokens == 7 and not s.truncated


def test_usage_in_every_chunk_takes_the_last_report():
    """vLLM's continuous usage stats: each chunk carries a running count."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for i in range(3):
            await resp.write(
                event(
                    {
                        "choices": [{"index": 0, "text": "x"}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": i + 1},
                    }
                )
            )
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler, max_tokens=3)
    assert s.ok and s.output_tokens == 3 and not s.truncated


def test_fallback_token_count_is_text_chunks_and_marks_truncation():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for c in "abc":
            await resp.write(text(c))
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler, max_tokens=8)
    assert s.ok
    assert s.output_tokens == 3
    assert s.prompt_tokens == 3  # no usage: the caller's count
    assert s.truncated  # 3 < 8 requested


def test_chat_delta_content_shape():
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["path"] = request.path
        seen["body"] = await request.json()
        resp = await open_stream(request)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return event(
                {
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        await resp.write(chunk({"role": "assistant", "content": ""}))  # not a token
        await asyncio.sleep(0.04)
        await resp.write(chunk({"content": "Hi"}))
        await asyncio.sleep(GAP)
        await resp.write(chunk({"reasoning_content": "hmm"}))
        await asyncio.sleep(GAP)
        await resp.write(chunk({"content": " there"}))
        await resp.write(chunk({}, finish="length"))  # no text
        await resp.write(usage(completion=4, prompt=9))
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler, endpoint="chat", max_tokens=4)
    assert seen["path"] == "/v1/chat/completions"
    assert seen["body"]["messages"] == [{"role": "user", "content": "hello there"}]
    assert "prompt" not in seen["body"]
    assert seen["body"]["stream"] is True
    assert seen["body"]["stream_options"] == {"include_usage": True}
    assert s.ok, s.error
    assert s.ttft is not None and s.ttft >= 0.04
    assert len(s.itl) == 2
    assert s.output_tokens == 4 and s.prompt_tokens == 9
    assert not s.truncated
    assert_e2e_is_ttft_plus_itl(s)


def test_completions_body_shape():
    body = build_body("completions", "served", "p", 16)
    assert body["prompt"] == "p" and "messages" not in body
    assert body["model"] == "served" and body["max_tokens"] == 16
    assert body["stream"] is True and body["ignore_eos"] is True


# --- stream hygiene --------------------------------------------------------


def test_comments_and_other_sse_fields_are_ignored():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(b": keep-alive\n\n")
        await resp.write(b"retry: 1000\n\n")
        await asyncio.sleep(0.04)
        await resp.write(b": ping\n\nevent: message\nid: 1\n")
        await resp.write(b'data:{"choices":[{"index":0,"text":"a"}]}\n\n')  # no space
        await asyncio.sleep(0.01)
        await resp.write(b": still alive\n\n\n\n")
        await resp.write(text("b"))
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler)
    assert s.ok, s.error
    assert s.ttft is not None and s.ttft >= 0.04  # comments are not first token
    assert s.output_tokens == 2 and len(s.itl) == 1


@pytest.mark.parametrize("after_done", [b"", b": ping\n\n"])
def test_done_then_connection_left_open_returns_promptly(after_done: bytes):
    """After [DONE] the server neither closes nor finishes the chunked body
    (silently, or still sending keep-alives): ``send`` must not wait."""
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("a") + text("b") + usage(2) + DONE)
        try:
            while not release.is_set():
                if after_done:
                    await resp.write(after_done)
                await asyncio.sleep(0.01)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client hung up: expected
        return resp

    async def main() -> tuple[RequestSample, float]:
        async with serve(handler) as base:
            try:
                return await _send(base, timeout=5.0)
            finally:
                release.set()

    s, wall = asyncio.run(main())
    assert s.ok, s.error
    assert s.output_tokens == 2
    # not the 5 s request timeout (a margin for a busy core: the fast tier
    # runs on one worker per core)
    assert wall < 2.5


# --- failures become samples ----------------------------------------------


def test_error_object_mid_stream():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("a") + text("b"))
        await resp.write(
            event(
                {
                    "error": {
                        "object": "error",
                        "message": "KV cache exhausted",
                        "type": "InternalServerError",
                        "code": 500,
                    }
                }
            )
        )
        await resp.write(DONE)
        return resp

    s, _ = run_with(handler)
    assert not s.ok
    assert "KV cache exhausted" in (s.error or "")
    assert s.e2e is None and s.tpot is None
    assert not s.truncated  # failed, not truncated


def test_error_string_mid_stream():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(event({"error": "overloaded"}) + DONE)
        return resp

    s, _ = run_with(handler)
    assert not s.ok and "overloaded" in (s.error or "")


@pytest.mark.parametrize("status", [429, 503])
def test_http_error_status(status: int):
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"error": {"message": "slow down", "code": status}}, status=status
        )

    s, wall = run_with(handler)
    assert not s.ok
    assert f"HTTP {status}" in (s.error or "")
    assert "slow down" in (s.error or "")
    assert s.ttft is None and s.e2e is None and s.itl == []
    assert wall < 1.0


def test_http_error_with_undecodable_body():
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=503, body=b"\xff\xfe\x00 upstream gone", content_type="text/plain"
        )

    s, _ = run_with(handler)
    assert not s.ok and "HTTP 503" in (s.error or "")


def test_connection_refused_is_a_sample():
    async def main() -> tuple[RequestSample, float]:
        return await _send(f"http://127.0.0.1:{free_port()}", timeout=2.0)

    s, wall = asyncio.run(main())
    assert not s.ok and s.error
    assert s.ttft is None and s.e2e is None
    assert wall < 1.0


def test_no_tokens_at_all_is_an_error():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("") + usage(0) + DONE)
        return resp

    s, _ = run_with(handler)
    assert not s.ok and "no tokens" in (s.error or "")
    assert s.output_tokens == 0 or s.e2e is None


def test_empty_200_body_is_an_error():
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, body=b"", content_type="text/event-stream")

    s, _ = run_with(handler)
    assert not s.ok and "no tokens" in (s.error or "")


def test_stream_cut_mid_way_is_an_error():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("a") + text("b"))
        await asyncio.sleep(0.01)
        assert request.transport is not None
        request.transport.close()  # chunked body never terminated
        return resp

    s, _ = run_with(handler)
    assert not s.ok and s.error


def _dropping(first_n: int, calls: list[int]) -> Any:
    """A handler that closes the connection, before any answer, on its first
    ``first_n`` requests (a keep-alive connection the server had closed),
    then streams one token."""
    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        if len(calls) <= first_n:
            assert request.transport is not None
            request.transport.close()
            return web.Response()  # never reaches the client
        resp = await open_stream(request)
        await resp.write(text("a") + usage(1) + DONE)
        return resp

    return handler


def test_a_request_dropped_before_any_answer_is_sent_once_more():
    """Closed before a byte of answer: sent again on a connection of its own,
    and the run's checks count it; dropped twice, it is a failed request."""
    from qtune.load.client import sample_checks

    calls: list[int] = []
    s, _ = run_with(_dropping(1, calls))
    assert s.ok and s.output_tokens == 1 and len(calls) == 2
    assert s.resent is not None and "ServerDisconnected" in s.resent
    checks = sample_checks([s, RequestSample()], "completions")
    assert checks["resent"] == {"requests": 1, "example": s.resent}
    calls = []
    s, _ = run_with(_dropping(2, calls))
    assert not s.ok and "ServerDisconnected" in (s.error or "") and len(calls) == 2


def test_a_stream_cut_after_its_answer_began_is_not_sent_again():
    calls: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        resp = await open_stream(request)
        await resp.write(text("a"))
        await asyncio.sleep(0.01)
        assert request.transport is not None
        request.transport.close()
        return resp

    s, _ = run_with(handler)
    assert not s.ok and s.resent is None and len(calls) == 1


def test_timeout_is_a_sample():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await asyncio.sleep(1.0)  # cancelled by the runner's short shutdown
        return resp

    s, wall = run_with(handler, timeout=0.1)
    assert not s.ok and "timeout" in (s.error or "")
    assert wall < 0.95  # the 0.1 s timeout, not the handler's 1 s


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"null",
        b'{"choices": ["x"]}',
        b'{"choices": [{"text": "b"}], "usage": "n/a"}',
    ],
)
def test_malformed_payload_is_a_sample(payload: bytes):
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("a") + b"data: " + payload + b"\n\n" + DONE)
        return resp

    s, _ = run_with(handler)
    assert not s.ok and s.error


def test_overlong_sse_line_is_a_sample():
    # 1 MiB in one SSE line: over aiohttp's line limit (LineTooLong, which
    # is not a ClientError).  It must become a failed sample, not raise.
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        try:
            await resp.write(text("x" * (1 << 20)) + DONE)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client gave up first
        return resp

    s, _ = run_with(handler)
    assert not s.ok and s.error


def test_sample_never_shares_itl_list():
    a, b = RequestSample(), RequestSample()
    a.itl.append(1.0)
    assert b.itl == []


def test_json_roundtrip_of_event_helper():
    # Guard the helper itself: the framing tests rely on it.
    assert json.loads(text("q")[6:].strip()) == {
        "choices": [{"index": 0, "text": "q", "finish_reason": None}]
    }


# --- timeouts: a dead server is a failed sample with its reason -------------


async def _send_kw(base: str, **kw: Any) -> tuple[RequestSample, float]:
    body = build_body("completions", "m", "hello there", 8)
    async with aiohttp.ClientSession() as session:
        t0 = now()
        s = await send(session, base + "/v1/completions", body, prompt_tokens=3, **kw)
        return s, now() - t0


def test_stream_that_stops_mid_way_is_a_stalled_sample():
    """Two tokens, then silence with the connection open: before the stall
    timeout existed this held the request for the whole 600 s timeout."""

    async def main() -> tuple[RequestSample, float]:
        async with serve(stalling(after=2, hold=5.0)) as base:
            return await _send_kw(base, timeout=30.0,
                                           stall_timeout=0.3)

    s, wall = asyncio.run(main())
    assert not s.ok and s.error == "stalled: no data for 0.3 s"
    assert s.ttft is not None  # it did start
    assert 0.3 <= wall < 1.5


def test_keepalive_comments_are_data_for_the_stall_clock():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await resp.write(text("a"))
        for _ in range(5):  # 0.5 s of comments, each 0.1 s apart
            await asyncio.sleep(0.1)
            await resp.write(b": ping\n\n")
        await resp.write(text("b") + usage(2) + DONE)
        return resp

    async def main() -> tuple[RequestSample, float]:
        async with serve(handler) as base:
            return await _send_kw(base, timeout=30.0,
                                           stall_timeout=0.3)

    s, _ = asyncio.run(main())
    assert s.ok, s.error


def test_request_timeout_bounds_a_slow_first_token():
    """No byte before the first token: only the whole-request timeout applies
    there (a first token may follow a long queue), and it is worded so."""

    async def main() -> tuple[RequestSample, float]:
        async with serve(stalling(after=0, hold=5.0)) as base:
            return await _send_kw(base, timeout=0.4,
                                           stall_timeout=0.1)

    s, wall = asyncio.run(main())
    assert not s.ok and s.error == "timeout: request over 0.4 s"
    assert 0.4 <= wall < 1.5


# --- usage the server gets wrong is not believed ----------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"prompt_tokens": 5, "completion_tokens": -40}, "completion_tokens"),
        ({"prompt_tokens": -1, "completion_tokens": 3}, "prompt_tokens"),
        ({"prompt_tokens": 5, "completion_tokens": 2.5}, "completion_tokens"),
        ({"prompt_tokens": 5, "completion_tokens": "3"}, "completion_tokens"),
        ({"prompt_tokens": 5, "completion_tokens": 100_000}, "completion_tokens"),
        ({"prompt_tokens": 10**9, "completion_tokens": 3}, "prompt_tokens"),
    ],
    ids=["negative-out", "negative-in", "fraction", "text", "over-max", "absurd-in"],
)
def test_bad_usage_is_flagged_and_client_counts_used(raw: dict[str, Any], field: str):
    s, _ = run_with(with_usage(raw, tokens=3), max_tokens=8)
    assert s.ok, s.error  # the latencies are still real
    assert s.usage_problem and f"usage.{field}" in s.usage_problem
    assert s.output_tokens == 3  # the three text chunks, not the report
    assert s.prompt_tokens == 3 and s.server_prompt_tokens is None  # the client's


def test_good_usage_is_believed():
    s, _ = run_with(with_usage({"prompt_tokens": 9, "completion_tokens": 8}), max_tokens=8)
    assert s.ok and s.usage_problem is None
    assert s.output_tokens == 8 and s.prompt_tokens == 9 == s.server_prompt_tokens


def test_sample_checks_flag_length_mismatch_and_distrust():
    from qtune.load.client import sample_checks

    def sample(req: int | None, srv: int | None, problem: str | None = None):
        return RequestSample(ttft=0.1, e2e=0.2, output_tokens=2,
                             requested_prompt_tokens=req, server_prompt_tokens=srv,
                             usage_problem=problem)

    # 678 counted where 200 were asked (the CPU target without a tokenizer).
    c = sample_checks([sample(200, 678)] * 4, "completions")
    assert c["length_mismatch"] == pytest.approx(2.39)
    assert c["prompt_length"]["requests"] == 4
    # A BOS token more, or 4% off: within what is allowed.
    assert "length_mismatch" not in sample_checks([sample(8, 9)] * 3, "completions")
    assert "length_mismatch" not in sample_checks([sample(200, 208)], "completions")
    assert "length_mismatch" in sample_checks([sample(200, 212)], "completions")
    # A chat template's tokens are allowed on top.
    assert "length_mismatch" not in sample_checks([sample(200, 230)], "chat")
    # Dataset prompts nobody counted are not compared.
    assert sample_checks([sample(None, 500)], "completions") == {}
    bad = sample_checks([sample(200, None, "usage.completion_tokens=-4 is negative")],
                        "completions")
    assert bad["usage_distrusted"]["requests"] == 1
    assert bad["usage_distrusted"]["by_field"] == {"usage.completion_tokens": 1}
