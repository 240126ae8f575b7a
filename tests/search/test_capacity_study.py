"""A capacity study end to end with a stand-in engine whose capacity is
known (a batch limit of N streams: N / (tokens x delay) requests per
second): after the engine defaults, a config that cannot beat the best
capacity so far costs one probe (issue 27), one that can is searched upward
from it, and the confirmation re-measures each at its capacity on a fresh
start."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from qtune.engines import ENGINES
from qtune.engines.base import LaunchSpec, Param, SpaceContext
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.objectives import parse_slo
from qtune.options import CapacitySearch, Confirmation
from qtune.search import tune
from qtune.search.config import TuneConfig
from tests.fakes.engine import FakeEngine

ROOT = Path(__file__).parent.parent.parent
# Each study starts its fake servers and probes for seconds, and is judged on
# their measured latency: serially (`measures`), not beside other tests.
pytestmark = [pytest.mark.slow, pytest.mark.measures]


class SlotsEngine(FakeEngine):
    """The fake engine with a batch limit: ``slots`` streams at once, 4 by
    default (its defaults' capacity: 4 / (10 x 20 ms) = 20 req/s)."""

    name = "slots"

    def space(self, ctx: SpaceContext) -> list[Param]:
        return [Param("slots", "int", low=1, high=6)]

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        return {"slots": 4}, None

    def launch_spec(self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str,
                    port: int) -> LaunchSpec:
        spec = super().launch_spec({"delay_ms": 20}, ctx, host=host, port=port)
        return dataclasses.replace(spec, argv=(*spec.argv, "--slots",
                                               str(params.get("slots", 4))))


@pytest.fixture
def slots(monkeypatch, cpu_host, tmp_path):
    import qtune.search.inputs as search

    monkeypatch.setitem(ENGINES, "slots", SlotsEngine())
    host = dataclasses.replace(cpu_host, engines=InstalledEngines(
        sys.executable, [EngineInstall("slots", "1.0", "cpu", sys.executable)]))
    monkeypatch.setattr(search, "probe", lambda **kw: host)
    return TuneConfig(
        engine="slots", trials=2, seed=3, sampler="random", objective="capacity",
        slo=parse_slo("e2e_p99<=600ms"), capacity=CapacitySearch(window=2.0),
        confirm=Confirmation(top=1, repeats=1),
        workload=Workload(input_len=8, output_len=10, rate=5, requests=10,
                          warmup_requests=4),
        studies_dir=tmp_path / "studies", profiles_dir=tmp_path / "profiles",
        study="cap", startup_timeout=60)


def _log_tails(root: Path, pattern: str) -> dict[str, str]:
    """The last lines of each matching server log: why a fresh start failed."""
    return {p.name: "\n".join(p.read_text(errors="replace").splitlines()[-8:])
            for p in sorted(root.rglob(pattern))}


def _space(tmp_path: Path, slots: int) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(f"slots: [{slots}]\n")
    return p


def test_a_config_that_cannot_beat_the_defaults_costs_one_probe(slots, tmp_path):
    res = tune(dataclasses.replace(slots, space_file=_space(tmp_path, 1)))
    base, worse = res.trials
    assert base.baseline and base.status == "ok" and base.value >= 10
    cap = base.summary["capacity"]
    assert cap["found"] and len(cap["steps"]) >= 3
    # slots 1 holds a quarter of the defaults' capacity: one probe, at the
    # defaults' capacity, over their window, and nothing else measured
    assert worse.status == "pruned" and worse.reason == "below_incumbent"
    steps = worse.partial_summary["capacity"]["steps"]
    assert len(steps) == 1 and steps[0]["load"] == base.value
    assert f"trial {base.number}" in worse.detail and "cannot win" in worse.detail
    assert worse.measure_s <= 0.4 * base.measure_s, (worse.measure_s, base.measure_s)
    # the winner stays the defaults, confirmed alone on a fresh start: their
    # figure is the answer (on one H200 the defaults' search held a load
    # once that vLLM's own client then failed)
    assert res.best.number == base.number and res.improvement == 1.0
    conf = res.profile.metrics["confirmation"]
    assert list(conf) == [str(base.number)] and conf[str(base.number)]["runs"], (
        conf, _log_tails(tmp_path / "studies", "confirm-*.log"))
    # the capacity read from every window's verdict: the search's and the
    # fresh start's, with an interval around the load the defaults held
    # (the search failed above what it held: its bracket has an upper end)
    assert cap["bracket"][1] is not None and "from_verdicts" in cap
    v = conf[str(base.number)]["from_verdicts"]
    decided = sum(not st.get("retried") for st in cap["steps"])
    assert v["windows"] > decided and v["ci90"][0] <= v["median"] <= v["ci90"][1]
    assert v["ci90"][0] <= base.value * 1.5 and v["ci90"][1] >= base.value / 1.5
    assert res.pruning["below_incumbent"] == 1 and res.pruning["probes"] == len(cap["steps"]) + 1


def test_a_config_that_holds_the_incumbent_is_searched_upward(slots, tmp_path):
    res = tune(dataclasses.replace(slots, space_file=_space(tmp_path, 6), study="up"))
    base, better = res.trials
    assert better.status == "ok" and better.value > base.value
    steps = better.summary["capacity"]["steps"]
    assert steps[0]["load"] == base.value and steps[0]["ok"]  # the floor first
    assert min(st["load"] for st in steps) >= base.value
    assert res.best.number == better.number
    assert res.improvement is not None and res.improvement > 1.0
    # The confirmation: the winner holds its capacity again on a fresh start,
    # and the defaults, asked to hold it too, do not: the gain is separated.
    # On that start they are then probed at their own capacity (the fallback
    # rung), which sits at their knee: it holds or not by chance, and the
    # gain is separated either way.  (Asserting that it failed made this
    # test fail now and then: 2 of about 9 runs over two sessions, the
    # latest in the fresh-clone CI of d265b30.)
    #
    # The winner's capacity sits at its knee too: its search found 30.6 req/s
    # where 6 slots give 30, and held it over two windows in the trial's
    # re-measure; its confirmation over two windows on a fresh start then
    # failed it and held the rung below, the highest load its search held
    # under it (the CI run of 082f37a).  That rung may be the defaults' own
    # capacity (the floor its search started from), or barely above it:
    # then the defaults may hold it too, and "no gain beyond the noise" is
    # the right verdict.  The clean case is asserted in full.
    conf = res.profile.metrics["confirmation"]
    won, defaults = conf[str(better.number)], conf[str(base.number)]
    obj = res.profile.metrics["objective"]
    (held,) = won["fresh"]
    assert not won["failures"]
    if held != better.value:
        assert base.value <= held < better.value, (held, better.value)
        assert "did not hold on a fresh start" in won["runs"][0]
        assert won["bracket"] == [held, better.value]
        challenged = [r for r in defaults["runs"] if "did not hold on a fresh start" in r]
        assert obj["separated"] is bool(challenged), (defaults, obj)
        return
    assert defaults["load"] == better.value
    assert "did not hold on a fresh start" in defaults["runs"][0]
    if defaults["failures"]:
        assert defaults["failures"] == 1 and not defaults["fresh"]
    else:
        assert defaults["fresh"] == [base.value] and base.value < better.value
    assert obj["separated"] is True and obj["interval"][0] > 1.0
