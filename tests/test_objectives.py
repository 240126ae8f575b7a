"""Every registered objective: its direction, the value it reads from a
measurement summary, whether it needs an SLO and whether it can be pruned;
and the SLO parser."""

from __future__ import annotations

import pytest

from qtune.bench import KEY_METRICS
from qtune.errors import InputError
from qtune.metrics import metric_value
from qtune.objectives import (
    OBJECTIVES,
    get_objective,
    lower_is_better,
    pareto_latency,
    parse_slo,
)

# One summary with a different number in every field, so an objective that
# reads the wrong one cannot pass.
SUMMARY = {
    "completed": 10, "failed": 0,
    "request_throughput": 2.5, "output_token_throughput": 40.0,
    "ttft_ms": {"mean": 10.0, "p50": 11.0, "p90": 12.0, "p99": 13.0},
    "tpot_ms": {"mean": 20.0, "p50": 21.0, "p90": 22.0, "p99": 23.0},
    "itl_ms": {"mean": 30.0, "p50": 31.0, "p90": 32.0, "p99": 33.0},
    "e2e_ms": {"mean": 40.0, "p50": 41.0, "p90": 42.0, "p99": 43.0},
    "goodput": {"request_goodput": 1.5, "slo_met": True},
    "capacity": {"found": True, "value": 6.0},
}

# name: (direction, value in SUMMARY, metric a fixed-load run is judged by,
#        needs an SLO, prunable mid-run).  A new objective needs a row here.
EXPECTED = {
    "e2e_p99": ("minimize", 43.0, "e2e_p99", False, True),
    "ttft_p99": ("minimize", 13.0, "ttft_p99", False, True),
    "tpot_p99": ("minimize", 23.0, "tpot_p99", False, True),
    "itl_p99": ("minimize", 33.0, "itl_p99", False, False),
    "e2e_p50": ("minimize", 41.0, "e2e_p50", False, True),
    "ttft_p50": ("minimize", 11.0, "ttft_p50", False, True),
    "tpot_p50": ("minimize", 21.0, "tpot_p50", False, True),
    "throughput": ("maximize", 2.5, "throughput", False, False),
    "output_throughput": ("maximize", 40.0, "output_throughput", False, False),
    "goodput": ("maximize", 1.5, "goodput", True, False),
    "capacity": ("maximize", 6.0, "goodput", True, False),
    "pareto": ("pareto", 43.0, "e2e_p99", False, False),
    "pareto:ttft_p50": ("pareto", 11.0, "ttft_p50", False, False),
}


def test_every_registered_objective_is_expected():
    assert set(OBJECTIVES) == set(EXPECTED) - {"pareto", "pareto:ttft_p50"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_objective(name):
    direction, value, run_metric, needs_slo, prunable = EXPECTED[name]
    obj = get_objective(name)
    assert obj.name == name and obj.direction == direction
    assert obj.value(SUMMARY) == pytest.approx(value)
    assert obj.run_metric == run_metric
    assert obj.needs_slo is needs_slo and obj.prunable is prunable
    # verify judges from one run at a fixed load (no capacity search in it):
    # every objective must be readable there.
    one_run = {k: v for k, v in SUMMARY.items() if k != "capacity"}
    assert metric_value(one_run, obj.run_metric) is not None
    if direction != "pareto":
        assert lower_is_better(name) is (direction == "minimize")


def test_values_missing_from_a_summary():
    nothing = {"request_throughput": 0.0, "output_token_throughput": 0.0,
               "ttft_ms": None, "tpot_ms": None, "itl_ms": None, "e2e_ms": None}
    assert get_objective("e2e_p99").value(nothing) is None
    assert get_objective("pareto").value(nothing) is None
    assert get_objective("goodput").value(nothing) is None
    # No load held the SLO: a capacity of 0, which ranks below any found one.
    assert get_objective("capacity").value({"capacity": {"found": False}}) == 0.0


def test_lower_is_better_for_every_reported_metric():
    for m in KEY_METRICS:
        assert lower_is_better(m) is ("throughput" not in m), m


def test_unknown_objective():
    with pytest.raises(InputError) as e:
        get_objective("e2e_p98")
    assert "e2e_p99" in e.value.hint


def test_pareto_objective():
    assert get_objective("pareto").direction == "pareto"
    assert pareto_latency("pareto") == "e2e_p99"
    assert pareto_latency("pareto:ttft_p99") == "ttft_p99"
    assert pareto_latency("e2e_p99") is None
    with pytest.raises(InputError, match="not a latency"):
        get_objective("pareto:throughput")


def test_objectives_load_no_optuna():
    """``qtune bench`` parses --slo: that must not load the search."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, qtune.objectives, qtune.bench, qtune.verify; "
            "print('optuna' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "False"


def test_parse_slo_units_and_ops():
    slos = parse_slo("ttft_p99<=500ms, tpot_p99<=50ms,e2e_p99<=3s,throughput>=2.5")
    assert [(s.metric, s.op, s.limit) for s in slos] == [
        ("ttft_p99", "<=", 500.0),
        ("tpot_p99", "<=", 50.0),
        ("e2e_p99", "<=", 3000.0),
        ("throughput", ">=", 2.5),
    ]
    assert slos[0].violation(400.0) == -100.0
    assert slos[0].violation(600.0) == 100.0
    assert slos[3].violation(3.0) == -0.5
    assert slos[0].violation(None) > 0  # no measurement cannot meet an SLO


@pytest.mark.parametrize(
    "text",
    ["ttft<=500ms", "ttft_p99=500", "ttft_p99>=5ms", "throughput<=3", "foo_p99<=1ms",
     "ttft_p99<=5req/s", "ttft_p99<=abc"],
)
def test_parse_slo_rejects(text):
    with pytest.raises(InputError) as e:
        parse_slo(text)
    assert e.value.hint
