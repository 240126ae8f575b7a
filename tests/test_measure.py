"""The typed measurement gives back the summary exactly as the study stores
it, and repeated measurements rotate their order."""

from __future__ import annotations

from qtune.measure import Measurement, interleaved


def _summary(**extra):
    s = {"completed": 9, "failed": 1, "truncated": 0, "duration_s": 2.5,
         "request_throughput": 3.6, "output_token_throughput": 36.0,
         "total_token_throughput": 72.0, "input_tokens": 90, "output_tokens": 90,
         "errors": {"HTTP 500": 1}, "ttft_ms": {"mean": 1.0, "p50": 1.0, "p90": 2.0,
                                                "p99": 3.0},
         "tpot_ms": None, "itl_ms": None, "e2e_ms": {"mean": 5.0, "p50": 5.0, "p90": 6.0,
                                                     "p99": 7.0},
         "warmup_requests": 2, "warmup_s": 0.4, "saturated": False, "stopped_early": None}
    s.update(extra.pop("checks", {}))
    s.update({"cache_reset": True, "held_peak": 4})
    s.update(extra)
    return s


def test_a_summary_round_trips_with_its_keys_in_order():
    plain = _summary()
    full = _summary(checks={"length_mismatch": {"share": 0.2}, "usage_distrusted": "x"},
                    goodput={"request_goodput": 3.0, "slo_met": True},
                    keeps_up={"served_share": 1.0}, server={"kv": 0.5},
                    contaminated="hit rate 90%", capacity={"found": True, "value": 4})
    for s in (plain, full):
        m = Measurement.from_summary(s)
        assert list(m.to_dict().items()) == list(s.items())
    m = Measurement.from_summary(full)
    assert m.checks == {"length_mismatch": {"share": 0.2}, "usage_distrusted": "x"}
    assert m.capacity == {"found": True, "value": 4} and m.failed == 1
    # When it ran is kept beside the summary, never stored inside it.
    m.started, m.measure_s, m.startup_s = "2026-12-01T00:00:00", 2.5, 1.0
    assert m.to_dict() == full


def test_interleaved_rotates_by_one_per_repeat():
    assert [x for _, x in interleaved("ABC", 3)] == list("ABCBCACAB")
    assert [r for r, _ in interleaved("AB", 2)] == [0, 0, 1, 1]
    assert list(interleaved([], 3)) == []
