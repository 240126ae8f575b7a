"""``qtune.metrics``: percentiles, exclusions, throughput, metric lookup.

Expected values are worked out by hand below (linear interpolation: the
p-th percentile of n sorted values sits at index (n-1)·p/100, between the two
neighbours), not by calling numpy.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from qtune.load.client import RequestSample
from qtune.metrics import metric_value, summarize


def ok(ttft: float, e2e: float, tokens: int, expected: int, itl=(), prompt=10):
    return RequestSample(
        start=100.0, ttft=ttft, e2e=e2e, itl=list(itl), prompt_tokens=prompt,
        output_tokens=tokens, expected_output_tokens=expected,
    )


def failed(error: str) -> RequestSample:
    # Wild numbers: if a failed request leaked into any statistic or total,
    # the expected values below would be far off.
    return RequestSample(
        start=100.0, ttft=5.0, e2e=9.0, itl=[3.0, 3.0], prompt_tokens=1000,
        output_tokens=500, expected_output_tokens=600, error=error,
    )


SAMPLES = [
    # ttft 10 ms, e2e 100 ms, 1 token: no TPOT
    ok(0.010, 0.100, tokens=1, expected=1),
    # TPOT (200-20)/4 = 45 ms
    ok(0.020, 0.200, tokens=5, expected=5, itl=[0.040, 0.050]),
    failed("HTTP 503: busy"),
    # TPOT (400-30)/8 = 46.25 ms; 9 < 16 requested: truncated
    ok(0.030, 0.400, tokens=9, expected=16, itl=[0.010]),
    failed("timeout after 600 s"),
    # TPOT (800-40)/2 = 380 ms
    ok(0.040, 0.800, tokens=3, expected=3),
    failed("HTTP 503: busy"),
]


@pytest.fixture
def summary():
    return summarize(SAMPLES, duration=2.0)


def test_counts(summary):
    assert summary["completed"] == 4
    assert summary["failed"] == 3
    assert summary["truncated"] == 1
    assert summary["errors"] == {"HTTP 503: busy": 2, "timeout after 600 s": 1}
    assert summary["input_tokens"] == 40  # failed prompts not counted
    assert summary["output_tokens"] == 1 + 5 + 9 + 3
    assert summary["duration_s"] == 2.0


def test_ttft_percentiles(summary):
    # sorted 10, 20, 30, 40 ms
    t = summary["ttft_ms"]
    assert t["mean"] == pytest.approx(25.0)
    assert t["p50"] == pytest.approx(25.0)  # index 1.5: 20 + .5·10
    assert t["p90"] == pytest.approx(37.0)  # index 2.7: 30 + .7·10
    assert t["p99"] == pytest.approx(39.7)  # index 2.97: 30 + .97·10


def test_e2e_percentiles(summary):
    # sorted 100, 200, 400, 800 ms
    e = summary["e2e_ms"]
    assert e["mean"] == pytest.approx(375.0)
    assert e["p50"] == pytest.approx(300.0)  # 200 + .5·200
    assert e["p90"] == pytest.approx(680.0)  # 400 + .7·400
    assert e["p99"] == pytest.approx(788.0)  # 400 + .97·400


def test_tpot_excludes_single_token_outputs(summary):
    # 45, 46.25, 380 ms (the 1-token request has none; with it, p50 would
    # not be 46.25)
    t = summary["tpot_ms"]
    assert t["mean"] == pytest.approx((45 + 46.25 + 380) / 3)
    assert t["p50"] == pytest.approx(46.25)  # index 1
    assert t["p90"] == pytest.approx(313.25)  # index 1.8: 46.25 + .8·333.75
    assert t["p99"] == pytest.approx(373.325)  # index 1.98: 46.25 + .98·333.75
    assert SAMPLES[0].tpot is None
    assert ok(0.01, 0.05, tokens=2, expected=2).tpot == pytest.approx(0.04)
    assert ok(0.01, 0.05, tokens=0, expected=2).tpot is None


def test_itl_pools_all_gaps_of_successful_requests(summary):
    # 40, 50 and 10 ms → sorted 10, 40, 50
    i = summary["itl_ms"]
    assert i["mean"] == pytest.approx(100 / 3)
    assert i["p50"] == pytest.approx(40.0)
    assert i["p90"] == pytest.approx(48.0)  # index 1.8: 40 + .8·10
    assert i["p99"] == pytest.approx(49.8)


def test_throughput_is_completed_over_duration(summary):
    assert summary["request_throughput"] == pytest.approx(4 / 2.0)  # not 7/2
    assert summary["output_token_throughput"] == pytest.approx(18 / 2.0)
    assert summary["total_token_throughput"] == pytest.approx((40 + 18) / 2.0)


def test_metric_value_names(summary):
    assert metric_value(summary, "e2e_p99") == pytest.approx(788.0)
    assert metric_value(summary, "ttft_p50") == pytest.approx(25.0)
    assert metric_value(summary, "tpot_p90") == pytest.approx(313.25)
    assert metric_value(summary, "itl_mean") == pytest.approx(100 / 3)
    assert metric_value(summary, "throughput") == pytest.approx(2.0)
    assert metric_value(summary, "output_throughput") == pytest.approx(9.0)
    for unknown in ("foo_p50", "e2e_p95", "e2e", "bogus", "", "duration_s",
                    "errors", "completed"):
        assert metric_value(summary, unknown) is None, unknown


def test_single_sample_percentiles_are_the_value():
    s = summarize([ok(0.012, 0.090, tokens=4, expected=4, itl=[0.02] * 3)], 1.0)
    assert s["ttft_ms"] == pytest.approx(
        {"mean": 12.0, "p50": 12.0, "p90": 12.0, "p99": 12.0}
    )
    assert s["tpot_ms"]["p99"] == pytest.approx(26.0)  # (90-12)/3


def test_even_count_median_interpolates():
    # 1..10 ms: p50 at index 4.5 → 5.5; p90 at 8.1 → 9.1; p99 at 8.91 → 9.91
    samples = [ok(k / 1000, 0.5, tokens=1, expected=1) for k in range(10, 0, -1)]
    t = summarize(samples, 1.0)["ttft_ms"]
    assert t["p50"] == pytest.approx(5.5)
    assert t["p90"] == pytest.approx(9.1)
    assert t["p99"] == pytest.approx(9.91)


@pytest.mark.parametrize("duration", [0.0, 5.0])
def test_empty_samples(duration):
    s = summarize([], duration)
    assert s["completed"] == 0 and s["failed"] == 0 and s["truncated"] == 0
    assert s["request_throughput"] == 0.0
    assert s["output_token_throughput"] == 0.0
    assert s["total_token_throughput"] == 0.0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert s[key] is None
    assert s["errors"] == {}
    assert metric_value(s, "e2e_p99") is None
    assert metric_value(s, "ttft_p50") is None
    assert metric_value(s, "throughput") == 0.0


def test_all_failed():
    s = summarize([failed("HTTP 429: slow down")] * 3, 1.5)
    assert s["completed"] == 0 and s["failed"] == 3
    assert s["errors"] == {"HTTP 429: slow down": 3}
    assert s["ttft_ms"] is None and s["e2e_ms"] is None
    assert s["request_throughput"] == 0.0 and s["output_tokens"] == 0
    assert metric_value(s, "e2e_p99") is None


def test_zero_duration_does_not_divide():
    s = summarize([ok(0.01, 0.02, tokens=2, expected=2)], 0.0)
    assert s["request_throughput"] == 0.0
    assert s["completed"] == 1 and s["ttft_ms"] is not None


def test_error_keys_are_capped():
    long_a = "x" * 80 + "a"
    long_b = "x" * 80 + "b"
    s = summarize([failed(long_a), failed(long_b)], 1.0)
    assert s["errors"] == {"x" * 80: 2}


# --- keeping up: a queue that grows, not a schedule that sends more ---------


def _stable(rates: tuple[float, float, float], third_s: float, service_s: float,
            seed: int, mix: bool = False) -> list[RequestSample]:
    """Poisson sends at ``rates`` over three thirds of ``third_s`` each, every
    request served in ``service_s`` +-50% (a server with room for all: no
    queue; the spread is fixed output lengths' jitter), or with ``mix`` in a
    lognormal time around it (sigma 1: a dataset's mix of output lengths)."""
    import random

    rng, times = random.Random(seed), random.Random(seed + 1)  # (sends as in CI)
    out, t = [], 0.0
    for k, rate in enumerate(rates):
        end = (k + 1) * third_s
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            e2e = service_s * (times.lognormvariate(-0.5, 1.0) if mix
                               else 0.5 + times.random())
            out.append(RequestSample(start=t, ttft=0.05, e2e=e2e, output_tokens=8))
    return out


def _queue(rate: float, window_s: float, slots: int, service_s: float) -> list[RequestSample]:
    """Evenly spaced sends into ``slots`` servers of ``service_s`` each, in
    order (first come, first served): above slots / service_s req/s the wait
    grows with every request."""
    free = [0.0] * slots
    out = []
    for i in range(int(rate * window_s)):
        t = i / rate
        k = min(range(slots), key=free.__getitem__)
        begin = max(t, free[k])
        free[k] = begin + service_s
        out.append(RequestSample(start=t, ttft=begin - t + 0.05, e2e=free[k] - t,
                                 output_tokens=8))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), more=st.floats(1.0, 1.5), rate=st.floats(10, 40),
       mix=st.booleans())
# the schedule that read 0.73x per send in CI of 9f21893 (0.71x with these times)
@example(seed=39693, more=1.0, rate=10.0, mix=False)
def test_a_schedule_that_sends_more_late_is_no_growing_queue(seed, more, rate, mix):
    """A server with room for every request keeps up whatever the schedule
    sends in the last third: the time a request spends in it does not grow.
    (Read as requests in flight, 1.2-1.26x more sends in the last third read
    "queue growing" on one H100, down to 16 req/s with a capacity of 17-20;
    read per send, this example read 0.73x at seed 39693, 10 req/s.  Either
    reading alone passes 1.3x on some stable windows: per send 1.2%, per
    request 4.5% with a lognormal mix, at 10 req/s; both at once in none of
    400, benchmarks/held_growth_noise.py.  0.25 is 7 sd of the per-request
    reading with fixed lengths.)"""
    from qtune.bench import falls_behind
    from qtune.metrics import keeps_up

    samples = _stable((rate, rate, rate * more), 10.0, 3.0, seed, mix)
    k = keeps_up(samples, rate)
    if not mix:  # (a lognormal mix reads 0.56-1.61x per request at 10 req/s)
        assert k["held_growth"] == pytest.approx(1.0, abs=0.25)
    assert not (falls_behind({"keeps_up": k, "ttft_ms": {"p50": 50.0}}, rate) or "") \
        .startswith("queue growing")


@pytest.mark.parametrize("over", [1.3, 1.6, 2.0])
def test_a_queue_that_grows_is_seen_whatever_the_sends(over):
    """An overload: the time in the server grows third by third."""
    from qtune.bench import falls_behind
    from qtune.metrics import keeps_up

    slots, service = 40, 2.0  # serves 20 req/s
    k = keeps_up(_queue(20.0 * over, 30.0, slots, service), 20.0 * over)
    assert k["held_growth"] > 1.3 and k["held_growth_per_send"] > 1.3
    assert k["sent_last"] == pytest.approx(k["sent_mid"], abs=1)
    assert falls_behind({"keeps_up": k, "ttft_ms": {"p50": 50.0}}, 20.0 * over) is not None

