"""Console lines that carry a finding, not just figures."""

from __future__ import annotations

from qtune.console import _uneven_replicas


def test_uneven_replicas_are_named_even_ones_are_not():
    engines = [{"engine": "0", "generation_tokens": 3200, "requests": 120},
               {"engine": "1", "generation_tokens": 4200, "requests": 160}]
    line = _uneven_replicas({"engines": engines, "generation_balance": 3200 / 4200})
    assert line == ("replicas uneven: generated tokens per engine 3200/4200 "
                    "(slowest 76% of the fastest)")
    assert _uneven_replicas({"engines": engines, "generation_balance": 0.9}) is None
    assert _uneven_replicas({"preemptions": 0}) is None  # one engine
    # Too few requests per engine: the split of requests alone can do that.
    few = [dict(e, requests=40) for e in engines]
    assert _uneven_replicas({"engines": few, "generation_balance": 0.76}) is None
    assert _uneven_replicas(None) is None  # no /metrics
