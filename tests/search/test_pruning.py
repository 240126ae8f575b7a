from __future__ import annotations

import numpy as np
import pytest

from qtune.metrics import percentile_exceeds_for_sure


@pytest.mark.parametrize("total", [10, 64, 100, 800])
@pytest.mark.parametrize("pct", [50.0, 90.0, 99.0])
def test_rule_is_exact_against_numpy(total, pct):
    # Whenever the rule says "exceeds for sure", every completion of the
    # remaining values (here: all zeros, the most favourable) still exceeds.
    rng = np.random.default_rng(int(total + pct))
    thr = 1.0
    for _ in range(200):
        done = list(rng.exponential(0.7, size=rng.integers(0, total + 1)))
        if percentile_exceeds_for_sure(done, [], total, pct, thr):
            best_case = done + [0.0] * (total - len(done))
            assert np.percentile(best_case, pct) > thr


def test_rule_fires_as_soon_as_it_can():
    # p99 of 100 values: k = floor(0.99 * 99) = 98, so 2 values above decide.
    assert not percentile_exceeds_for_sure([5.0], [], 100, 99, 1.0)
    assert percentile_exceeds_for_sure([5.0, 6.0], [], 100, 99, 1.0)
    # In-flight requests already older than the threshold count too.
    assert percentile_exceeds_for_sure([5.0], [1.5], 100, 99, 1.0)
    # p50 of 10: k = 4, so 6 values above are needed.
    assert not percentile_exceeds_for_sure([2.0] * 5, [], 10, 50, 1.0)
    assert percentile_exceeds_for_sure([2.0] * 6, [], 10, 50, 1.0)


def test_objective_pruning_leaves_the_margin_to_noise():
    """The best so far is one run: a trial is stopped only once it is sure to
    miss it by more than --prune-margin (SLO limits stay exact)."""
    from types import SimpleNamespace

    from qtune.objectives import parse_slo
    from qtune.search.pruning import make_pruner

    def prep(margin, slo=""):
        return SimpleNamespace(objective="e2e_p99", workload=SimpleNamespace(requests=100),
                               slo=parse_slo(slo) if slo else [], prune_margin=margin)

    def done(*e2e_s):
        return [SimpleNamespace(e2e=v, ttft=0.01, tpot=0.001, error=None, ok=True)
                for v in e2e_s]

    # p99 of 100: two values above the threshold decide it.
    slow = done(1.05, 1.06)  # 5-6% over a best of 1000 ms
    assert "cannot beat" in make_pruner(prep(0.0), 1000.0)(slow, [], 0.0)
    assert make_pruner(prep(0.1), 1000.0)(slow, [], 0.0) is None
    why = make_pruner(prep(0.1), 1000.0)(done(1.2, 1.3), [], 0.0)
    assert "by less than 10%" in why
    # An SLO is a limit the user set, not a noisy best: no margin.
    assert "breaks SLO" in make_pruner(prep(0.1, "e2e_p99<=1000ms"), None)(slow, [], 0.0)
