"""qtune.stats: a capacity read from noisy verdicts."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.stats import VerdictCapacity, capacity_from_verdicts

loads = st.floats(0.1, 1e4, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(loads, st.booleans()), min_size=1, max_size=30))
def test_an_interval_is_ordered_and_needs_a_hold_and_a_failure(verdicts):
    v = capacity_from_verdicts(verdicts)
    held = [x for x, h in verdicts if h]
    failed = [x for x, h in verdicts if not h]
    if not held or not failed:
        assert v is None
        return
    assert v is not None and v.low <= v.median <= v.high
    xs = [x for x, _ in verdicts]
    assert min(xs) / 3.01 <= v.low and v.high <= max(xs) * 3.01
    assert VerdictCapacity.from_dict(v.to_dict()) == v
    assert "windows' verdicts" in v.text("req/s")


def test_a_clean_bracket_is_inside_its_interval():
    v = capacity_from_verdicts([(16, True), (32, False), (24, False), (20, False),
                                (18, True), (19, False), (18, True)])
    assert v is not None and v.low < 18 < v.median < 19 < v.high


def _bisect(c: float, s: float, rng: random.Random) -> list[tuple[float, bool]]:
    """A capacity search's probes against a server whose window holds load x
    with probability 1 / (1 + exp((ln x - ln c) / s)): double from 4, then
    halve the bracket 5 times, the last load held measured again."""
    def probe(x: float) -> bool:
        return rng.random() < 1 / (1 + math.exp((math.log(x) - math.log(c)) / s))

    out, x, lo, hi = [], 4.0, None, None
    while hi is None and x < 1e4:
        held = probe(x)
        out.append((x, held))
        lo, hi = (x, None) if held else (lo, x)
        x *= 2
    for _ in range(5):
        if lo is None or hi is None:
            break
        mid = (lo + hi) / 2
        held = probe(mid)
        out.append((mid, held))
        lo, hi = (mid, hi) if held else (lo, mid)
    if lo is not None:
        out.append((lo, probe(lo)))
    return out


def test_the_interval_holds_the_true_capacity_about_as_often_as_it_says():
    """Against servers whose verdicts flip near the knee (spreads of 2-10% a
    logistic unit: run 25's 18-22 req/s band on one H100 is about 5%), 90%
    intervals from one search's probes hold the true capacity in at least 80%
    of 200 searches; the bracket [held, failed) it replaces, far less often.
    (The simulation is the fitted model's own family: this checks the fit, not
    that real servers flip this way; benchmarks/capacity_posterior.py reads
    real searches.)"""
    rng = random.Random(7)
    inside = in_bracket = n = 0
    for _ in range(200):
        c = rng.uniform(5, 50)
        s = rng.choice([0.02, 0.05, 0.1])
        verdicts = _bisect(c, s, rng)
        v = capacity_from_verdicts(verdicts)
        if v is None:
            continue
        n += 1
        inside += v.low <= c <= v.high
        held = [x for x, h in verdicts if h]
        failed = [x for x, h in verdicts if not h and x > max(held, default=0)]
        in_bracket += bool(held) and max(held) <= c < min(failed, default=math.inf)
    assert n > 170
    assert inside / n >= 0.8, (inside, n)
    assert in_bracket / n < inside / n - 0.2, (in_bracket, inside, n)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["median", "ci90", "low", "high", "windows", "x"]),
                      inner, max_size=6),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_a_study_file_s_verdict_capacity_is_read_or_refused_never_raised(d):
    """A study file is untrusted: whatever it holds where a capacity's
    interval belongs, reading it gives a finite, ordered interval or None."""
    v = VerdictCapacity.from_dict(d)
    if v is not None:
        assert 0 < v.low <= v.median <= v.high < math.inf and v.windows >= 2
        assert VerdictCapacity.from_dict(v.to_dict()) == v
