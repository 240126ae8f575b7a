"""``run_load``: in-flight cap, Poisson arrivals, warm-up, bounds, prompts.

A recording server on 127.0.0.1 notes every request's arrival, prompt and
end, and how many requests it holds at once.  Same process, same clock
(``time.perf_counter``) as the client's samples.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from qtune.load import LoadResult, PromptFactory, Workload, run_load
from qtune.model import generated_tokenizer
from tests.fakes.sse import DONE, now, open_stream, serve, text, usage


@dataclass
class Req:
    arrive: float
    prompt: str
    path: str
    end: float = 0.0  # before [DONE]: the client cannot have finished yet


@dataclass
class Recorder:
    first: float = 0.005  # before the first token
    gap: float = 0.005  # between tokens
    tokens: int = 2
    report_prompt_tokens: bool = True
    reqs: list[Req] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def handler(self, request: web.Request) -> web.StreamResponse:
        arrive = now()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            prompt = body.get("prompt") or body["messages"][0]["content"]
            r = Req(arrive, prompt, request.path)
            self.reqs.append(r)
            resp = await open_stream(request)
            await asyncio.sleep(self.first)
            for i in range(self.tokens):
                if i:
                    await asyncio.sleep(self.gap)
                await resp.write(text(f"t{i} "))
            n_prompt = len(prompt.split()) if self.report_prompt_tokens else 0
            await resp.write(usage(self.tokens, n_prompt))
        finally:
            # Counted out before [DONE]: a client that has read [DONE] (and
            # may start its next request) is never still counted here.
            r.end = now()
            self.in_flight -= 1
        await resp.write(DONE)
        return resp

    def prompts(self) -> list[str]:
        return [r.prompt for r in sorted(self.reqs, key=lambda r: r.arrive)]


def load(rec: Recorder, wl: Workload, **kw: Any) -> tuple[LoadResult, float]:
    async def main() -> tuple[LoadResult, float]:
        async with serve(rec.handler) as base:
            t0 = now()
            res = await run_load(base, "m", wl, **kw)
            return res, now() - t0

    return asyncio.run(main())


def wl(**kw: Any) -> Workload:
    base: dict[str, Any] = dict(input_len=6, output_len=2, warmup_requests=0)
    base.update(kw)
    return Workload(**base)


# --- concurrency -----------------------------------------------------------


@pytest.mark.parametrize("c", [1, 3])
def test_concurrency_caps_requests_in_flight(c: int):
    rec = Recorder(first=0.01, gap=0.005, tokens=3)
    res, _ = load(rec, wl(concurrency=c, requests=12))
    assert len(res.samples) == 12 and all(s.ok for s in res.samples)
    assert len(rec.reqs) == 12
    # Never above C, and C is reached: the cap is what limits, not luck.
    assert rec.max_in_flight == c


def test_requests_bound_is_exact():
    rec = Recorder()
    res, _ = load(rec, wl(concurrency=4, requests=10))
    assert len(res.samples) == 10 and len(rec.reqs) == 10
    rec = Recorder()
    res, _ = load(rec, wl(concurrency=8, requests=3))  # fewer than streams
    assert len(res.samples) == 3 and len(rec.reqs) == 3
    rec = Recorder()
    res, _ = load(rec, wl(rate=400.0, requests=7))
    assert len(res.samples) == 7 and len(rec.reqs) == 7


def test_duration_bound_stops_issuing():
    duration = 0.2
    rec = Recorder(first=0.01, gap=0.005, tokens=2)
    res, wall = load(rec, wl(concurrency=2, requests=None, duration=duration))
    n = len(res.samples)
    # ~15 ms a request on 2 streams: far more than 2, far fewer than the
    # unbounded count.
    assert 4 <= n <= 2 * (duration / 0.015 + 1)
    assert len(rec.reqs) == n
    first = min(s.start for s in res.samples)
    assert max(s.start for s in res.samples) <= first + duration + 0.01
    # in-flight ones finish; nothing new starts (unbounded, it would run on)
    assert wall < duration + 1.0


def test_duration_bound_wins_over_a_large_request_count():
    rec = Recorder(first=0.01, gap=0.005, tokens=2)
    res, wall = load(rec, wl(concurrency=2, requests=10_000, duration=0.15))
    assert 2 <= len(res.samples) < 100
    # The measured window stops at the duration; the wall time also holds
    # building the phase's requests up front (10,000 here), never mid-phase.
    assert res.duration < 0.15 + 0.3
    assert wall < 0.15 + 3.0


def test_duration_bound_in_rate_mode():
    duration, rate = 0.3, 100.0
    rec = Recorder()
    res, wall = load(rec, wl(rate=rate, requests=None, duration=duration, seed=3))
    n = len(res.samples)
    assert 12 <= n <= 55  # Poisson(30), fixed seed
    first = min(s.start for s in res.samples)
    assert max(s.start for s in res.samples) <= first + duration + 0.01
    assert wall < duration + 0.3


# --- Poisson arrivals ------------------------------------------------------


def _schedule(rec: Recorder) -> dict[str, float]:
    t0 = min(r.arrive for r in rec.reqs)
    return {r.prompt: r.arrive - t0 for r in rec.reqs}


def test_poisson_is_open_loop_and_reproducible():
    """Same seed → same prompts at the same offsets; another seed → other
    prompts.  Arrivals do not wait for completions (open loop)."""
    rate, n = 40.0, 12

    def run(seed: int) -> Recorder:
        rec = Recorder(first=0.08, gap=0.005, tokens=2)  # slower than arrivals
        res, _ = load(rec, wl(rate=rate, requests=n, seed=seed))
        assert len(res.samples) == n and all(s.ok for s in res.samples)
        return rec

    a, b, c = run(7), run(7), run(8)
    sa, sb, sc = _schedule(a), _schedule(b), _schedule(c)
    assert len(sa) == n  # distinct prompts, so the maps are complete
    assert sa.keys() == sb.keys()
    # Offsets are server arrivals, so a late first arrival (a slow first
    # connect on a loaded CI box) shifts every offset alike: compare after
    # removing the median shift, and let one arrival be late on its own.
    diffs = sorted(sb[p] - sa[p] for p in sa)
    shift = diffs[len(diffs) // 2]
    off = [p for p in sa if abs(sb[p] - sa[p] - shift) > 0.03]
    assert len(off) <= 1, off
    assert sc.keys().isdisjoint(sa.keys())
    # Exponential gaps: spread out, not a fixed interval and not a burst.
    offsets = sorted(sa.values())
    gaps = [y - x for x, y in zip(offsets, offsets[1:], strict=False)]
    span = offsets[-1]
    assert 0.25 * (n - 1) / rate < span < 4 * (n - 1) / rate
    assert max(gaps) > 2 * min(gaps) + 0.005
    # 80 ms per request at ~40 req/s: several overlap.
    assert a.max_in_flight >= 2


def test_an_arrival_seed_keeps_the_send_times_and_not_the_prompts():
    """A workload's arrival seed fixes when requests are sent and leaves what
    they send to its prompt seed: two probes of one load that share their
    bursts still meet no cached prompt.  It is no user's key."""
    rate, n = 40.0, 12

    def run(seed: int, arrivals: int | None) -> dict[str, float]:
        rec = Recorder(first=0.08, gap=0.005, tokens=2)
        load(rec, wl(rate=rate, requests=n, seed=seed, _arrival_seed=arrivals))
        return _schedule(rec)

    a, b, c = run(7, 99), run(8, 99), run(8, None)
    assert a.keys().isdisjoint(b.keys())  # fresh prompts
    sa, sb, sc = sorted(a.values()), sorted(b.values()), sorted(c.values())
    # the same send times (server arrivals; a late one may be late alone) ...
    assert sum(abs(x - y) > 0.03 for x, y in zip(sa, sb, strict=True)) <= 1
    # ... and without the arrival seed, the prompt seed's own
    assert sum(abs(x - y) > 0.03 for x, y in zip(sb, sc, strict=True)) > 1
    w = wl(rate=rate, seed=3, _arrival_seed=5)
    assert w.arrivals_seed == 5 and wl(rate=rate, seed=3).arrivals_seed == 3
    assert "_arrival_seed" not in w.to_dict() and "_arrival_seed" not in Workload.keys()


# --- warm-up ---------------------------------------------------------------


@pytest.mark.parametrize("mode", [{"concurrency": 2}, {"rate": 200.0}])
def test_warmup_is_separate_and_finishes_first(mode: dict[str, Any]):
    calls: list[tuple[str, int, int | None]] = []
    rec = Recorder(first=0.03, gap=0.005, tokens=2)
    res, _ = load(
        rec,
        wl(requests=6, warmup_requests=4, **mode),
        progress=lambda phase, done, total: calls.append((phase, done, total)),
    )
    assert len(res.warmup) == 4 and len(res.samples) == 6
    assert len(rec.reqs) == 10
    first = min(s.start for s in res.samples)
    # Client side: every warm-up request completed before the first send.
    assert all(w.ok for w in res.warmup)
    assert max(w.start + (w.e2e or 0.0) for w in res.warmup) <= first
    # Server side: exactly the 4 warm-up requests arrived before it, and
    # the server was done with all of them by then.
    before = [r for r in rec.reqs if r.arrive < first]
    assert len(before) == 4
    assert max(r.end for r in before) <= first
    # Warm-up prompts come from another seed than the measured ones.
    assert {r.prompt for r in before}.isdisjoint(
        r.prompt for r in rec.reqs if r.arrive >= first
    )
    # The measured window starts at the first measured send.
    last = max(s.start + (s.e2e or 0.0) for s in res.samples)
    assert res.duration == pytest.approx(last - first)
    # Progress: warm-up then measure, counts up to their totals.
    assert [c for c in calls if c[0] == "warm-up"][-1] == ("warm-up", 4, 4)
    assert [c for c in calls if c[0] == "measure"][-1] == ("measure", 6, 6)
    assert calls.index(("warm-up", 4, 4)) < min(
        i for i, c in enumerate(calls) if c[0] == "measure"
    )


def test_no_warmup_means_no_warmup_requests():
    rec = Recorder()
    res, _ = load(rec, wl(concurrency=2, requests=3, warmup_requests=0))
    assert res.warmup == [] and len(rec.reqs) == 3


# --- endpoint, failures ----------------------------------------------------


def test_chat_endpoint_path():
    rec = Recorder()
    res, _ = load(rec, wl(concurrency=1, requests=2, endpoint="chat"))
    assert {r.path for r in rec.reqs} == {"/v1/chat/completions"}
    assert all(s.ok for s in res.samples)


def test_failed_requests_are_samples_not_exceptions():
    seen = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        if seen % 2:
            return web.json_response({"error": "busy"}, status=503)
        resp = await open_stream(request)
        await resp.write(text("a") + text("b") + DONE)
        return resp

    async def main() -> LoadResult:
        async with serve(handler) as base:
            return await run_load(base, "m", wl(concurrency=1, requests=6))

    res = asyncio.run(main())
    assert len(res.samples) == 6
    assert sum(not s.ok for s in res.samples) == 3
    assert all("503" in (s.error or "") for s in res.samples if not s.ok)


# --- prompts ---------------------------------------------------------------


@pytest.fixture
def wordlevel(tmp_path, monkeypatch):
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path / "cache"))
    path = generated_tokenizer(512)
    assert str(path).startswith(str(tmp_path))
    return path


def test_prompt_factory_exact_tokens_with_tokenizer(wordlevel):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(wordlevel / "tokenizer.json"))
    pf = PromptFactory(wordlevel, seed=0)
    assert pf.tok is not None
    specials = {"<|endoftext|>", "<|im_end|>", "<unk>"}
    for n in (1, 2, 17, 256, 1000):
        prompt, k = pf.prompt(n)
        assert k == n
        ids = tok.encode(prompt, add_special_tokens=False).ids
        assert len(ids) == n
        assert not specials & set(prompt.split())
    # Deterministic per seed, different across seeds.
    def one(seed: int) -> tuple[str, int]:
        return PromptFactory(wordlevel, seed).prompt(32)

    assert one(5) == one(5)
    assert one(5) != one(6)


@pytest.mark.parametrize("n", [1, 7, 300])
def test_prompt_factory_without_tokenizer_gives_words(n: int, tmp_path):
    for path in (None, tmp_path):  # a folder without tokenizer.json too
        prompt, k = PromptFactory(path, seed=1).prompt(n)
        assert k == n
        assert len(prompt.split(" ")) == n and all(prompt.split(" "))


def test_run_load_sends_exact_length_prompts(wordlevel):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(wordlevel / "tokenizer.json"))
    rec = Recorder(report_prompt_tokens=False)  # usage without prompt_tokens
    res, _ = load(rec, wl(input_len=50, concurrency=2, requests=4), tokenizer=wordlevel)
    assert len(rec.reqs) == 4
    for r in rec.reqs:
        assert len(tok.encode(r.prompt, add_special_tokens=False).ids) == 50
    assert [s.prompt_tokens for s in res.samples] == [50] * 4



def test_idle_connections_are_not_reused_past_the_servers_timeout(monkeypatch):
    """vLLM's uvicorn closes a keep-alive connection idle for 5 s; aiohttp
    reuses the *oldest* idle connection first, with a 15 s default.  A
    request sent as the server closes that connection fails
    (ServerDisconnectedError): on the H200 this pruned two healthy trials at
    the start of their measured phase.  Here the server drops any connection
    reused after 0.4 s idle (the race, made certain) and the client's limit
    is scaled down to 0.2 s: every request must still succeed."""
    import qtune.load as load

    monkeypatch.setattr(load, "KEEPALIVE_S", 0.2)
    last_end: dict[Any, float] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername")
        if peer in last_end and now() - last_end[peer] > 0.4:
            request.transport.abort()  # the server's idle close, crossing
            raise asyncio.CancelledError
        await request.read()
        resp = await open_stream(request)
        await resp.write(text("t0 ") + text("t1 ") + usage(2) + DONE)
        last_end[peer] = now()
        return resp

    async def main() -> LoadResult:
        async with serve(handler) as url:
            wl = Workload(input_len=4, output_len=2, rate=2.0, arrival="constant",
                          requests=3, warmup_requests=1)
            return await run_load(url, "m", wl)

    res = asyncio.run(main())
    assert [s.error for s in res.samples if s.error] == []
    assert len(res.samples) == 3


# --- bounds and timeouts (issue 13 item 6) ---------------------------------


def test_duration_alone_runs_for_the_duration():
    """`--duration` without `--requests` stopped after 100 requests (the
    Workload's default count) in a quarter of the duration here."""
    rec = Recorder(first=0.002, gap=0.002, tokens=2)
    res, wall = load(rec, Workload(input_len=4, output_len=2, concurrency=4,
                                   duration=0.6, warmup_requests=0))
    starts = sorted(s.start for s in res.samples)
    assert len(res.samples) > 100
    assert starts[-1] - starts[0] >= 0.5  # sends went on for the duration
    assert wall < 0.6 + 0.5


def test_a_stalled_stream_fails_with_its_reason_and_the_run_goes_on():
    seen = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        resp = await open_stream(request)
        await resp.write(text("a"))
        if seen == 2:  # the second request's server stops mid-stream
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass
            return resp
        await resp.write(text("b") + usage(2, 4) + DONE)
        return resp

    async def main() -> tuple[LoadResult, float]:
        async with serve(handler) as base:
            t0 = now()
            r = await run_load(base, "m", wl(concurrency=2, requests=6, stall_timeout=0.3))
            return r, now() - t0

    res, wall = asyncio.run(main())
    assert [s.error for s in res.samples if not s.ok] == ["stalled: no data for 0.3 s"]
    assert len(res.samples) == 6 and wall < 2.0


# --- exact prompt lengths from the server's own tokenizer (item 7) ---------


def _counting(tmp_path, **kw: Any):
    from tests.fakes.sse import CountingServer, bpe_tokenizer

    return CountingServer(bpe_tokenizer(tmp_path / "tok"), **kw)


def _run_counting(srv, wl_: Workload, tokenizer: Any = "server") -> LoadResult:
    from qtune.load import ServerTokenizer

    async def main() -> LoadResult:
        async with serve(srv.completions, srv.routes()) as base:
            tok = tokenizer
            if tokenizer == "server":
                tok, why = await asyncio.to_thread(ServerTokenizer.connect, base, "m")
                assert tok is not None, why
            return await run_load(base, "m", wl_, tokenizer=tok)

    return asyncio.run(main())


def test_server_tokenize_gives_exact_lengths_and_no_call_in_the_phase(tmp_path):
    srv = _counting(tmp_path, bos=1)
    res = _run_counting(srv, wl(input_len=40, output_len=2, concurrency=2, requests=12,
                                warmup_requests=2))
    # 40 tokens in the server's own count, plus its BOS, every request.
    assert srv.counts == [41] * 14
    assert all(s.requested_prompt_tokens == 40 for s in res.samples)
    assert "length_mismatch" not in res.checks
    assert res.checks["prompt_length"]["server_mean"] == 41


def test_word_prompts_are_caught_by_the_length_check(tmp_path):
    """No tokenizer: N words are many more tokens in a BPE vocabulary (the CPU
    target counted 678 for --input-len 200); the run says so."""
    srv = _counting(tmp_path, bos=0)
    res = _run_counting(srv, wl(input_len=40, output_len=2, concurrency=2, requests=6),
                        tokenizer=None)
    assert min(srv.counts) > 44
    assert res.checks["length_mismatch"] > 0.1


def test_duration_phase_builds_its_prompts_before_it_starts(tmp_path):
    """With the server's tokenizer a prompt costs /tokenize round trips: a
    time-bound rate phase builds all it will send first."""
    srv = _counting(tmp_path)
    calls: list[int] = []

    from qtune.load import ServerTokenizer

    async def main() -> LoadResult:
        async with serve(srv.completions, srv.routes()) as base:
            tok, _ = await asyncio.to_thread(ServerTokenizer.connect, base, "m")
            assert tok is not None

            async def spy_completions(request: web.Request) -> web.StreamResponse:
                calls.append(srv.tokenize_calls)
                return await srv.completions(request)

            # Same tokenizer, a server that also notes /tokenize calls seen
            # at each completion.
            async with serve(spy_completions, srv.routes()) as base2:
                tok.base = base2
                return await run_load(base2, "m", wl(input_len=8, rate=40.0,
                                                     requests=None, duration=0.5),
                                      tokenizer=tok)

    res = asyncio.run(main())
    assert len(res.samples) >= 5
    assert len(set(calls)) == 1  # no /tokenize between the first and last send


# --- the client's own lateness ---------------------------------------------


@dataclass
class Blocking(Recorder):
    """A server in the client's own process that holds the loop (as a core
    taken by the server would) for ``block`` s on its ``at``-th request."""

    block: float = 0.4
    at: int = 3

    async def handler(self, request: web.Request) -> web.StreamResponse:
        if len(self.reqs) == self.at:
            import time

            time.sleep(self.block)  # the loop itself stops: every timer fires late
        return await super().handler(request)


def test_a_late_loop_is_measured_and_said():
    """The client's loop held for 0.4 s in the measured phase: LoopLag sees
    it, and ``bench.measure``'s text says what it does to the figures."""
    from qtune.bench import client_lag_text
    from qtune.load import LAG_NOTED_MS

    res, _ = load(Blocking(), wl(concurrency=2, requests=8))
    lag = res.client_lag
    # (lower bounds only: a loop held 0.4 s is at least that late; a busy
    # machine can only add to it)
    assert lag is not None and lag["max"] >= 0.3 * 1000, lag
    assert lag["late_s"] >= 0.3
    assert lag["max"] > LAG_NOTED_MS
    text = client_lag_text(lag)
    assert f"{lag['max']:,.0f} ms late" in text and "latencies read then" in text
