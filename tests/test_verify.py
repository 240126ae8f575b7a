"""verify's measuring loop with the stand-in engine: every side is started
afresh per repeat, in an order that rotates, on the same prompts."""

from __future__ import annotations

import pytest

from qtune.engines import ENGINES
from qtune.load.workload import Workload
from qtune.verify import Side, measure_sides
from tests.fakes.engine import FakeEngine

# Not in the fast tier: verify runs that start fake servers (4-9 s each).
pytestmark = pytest.mark.slow



def test_sides_rotate_and_each_repeat_starts_anew(monkeypatch, cpu_ctx, tmp_path):
    monkeypatch.setitem(ENGINES, "fake", FakeEngine())
    eng = FakeEngine()
    sides = []
    for label, delay in (("a", 1), ("b", 5), ("c", 20)):
        spec = eng.launch_spec({"delay_ms": delay}, cpu_ctx, host="127.0.0.1", port=1)
        sides.append(Side(label, list(spec.argv), dict(spec.env)))
    order: list[str] = []

    def progress(text: str) -> None:
        if text.endswith("starting"):
            order.append(text.split(": ")[1])

    wl = Workload(input_len=8, output_len=6, concurrency=2, requests=6, warmup_requests=0)
    lines: list[str] = []
    runs, starts, failed = measure_sides(sides, "fake", cpu_ctx, wl, 3, progress=progress,
                                 startup_timeout=60, log_dir=tmp_path, on_run=lines.append)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # One lasting line per run, with its figures (the spinner alone vanishes).
    assert len(lines) == 9 and lines[0].startswith("repeat 1/3: a: ready in ")
    assert "e2e p99 " in lines[0] and "req/s" in lines[0]
    assert {k: len(v) for k, v in runs.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(len(v) == 3 for v in starts.values())
    assert len(list(tmp_path.glob("*.log"))) == 9  # one fresh server per run
    # The sides differ only in token delay: the measurement sees it.
    med = {k: sorted(r["tpot_ms"]["p50"] for r in v)[1] for k, v in runs.items()}
    assert med["a"] < med["b"] < med["c"]
    assert all(r["completed"] == 6 and r["failed"] == 0 for v in runs.values() for r in v)
    assert failed == {"a": [], "b": [], "c": []}


def test_a_failed_start_is_reported_and_the_runs_go_on(monkeypatch, cpu_ctx, tmp_path):
    """Minutes into a verify, one side's start fails: the other runs still
    happen, and the failure is a line and a record, not the end."""
    monkeypatch.setitem(ENGINES, "fake", FakeEngine())
    eng = FakeEngine()
    sides = []
    for label, crash in (("ok", False), ("crash", True)):
        spec = eng.launch_spec({"delay_ms": 1, "crash": crash}, cpu_ctx,
                               host="127.0.0.1", port=1)
        sides.append(Side(label, list(spec.argv), dict(spec.env)))
    wl = Workload(input_len=8, output_len=4, concurrency=1, requests=2, warmup_requests=0)
    lines: list[str] = []
    runs, starts, failed = measure_sides(sides, "fake", cpu_ctx, wl, 2, startup_timeout=60,
                                         log_dir=tmp_path, on_run=lines.append)
    assert len(runs["ok"]) == 2 and len(starts["ok"]) == 2 and not failed["ok"]
    assert runs["crash"] == [] and len(failed["crash"]) == 2
    assert [ln for ln in lines if "crash: start failed: " in ln] and len(lines) == 4


class HostEnvEngine(FakeEngine):
    """An engine with a host default (vLLM: the shared compile cache)."""

    def launch_spec(self, params, ctx, *, host, port):
        import dataclasses

        spec = super().launch_spec(params, ctx, host=host, port=port)
        return dataclasses.replace(spec, host_env={"QTUNE_TEST_CACHE": "/shared"})


def test_verify_starts_carry_the_engines_host_defaults(monkeypatch, cpu_ctx, tmp_path):
    """A profile's argv and env do not hold the host's run defaults (they
    never reach a profile), so verify must take them from the engine: else
    every verify start of a GPU profile compiles from cold."""
    import qtune.measure as measure

    monkeypatch.setitem(ENGINES, "hostenv", HostEnvEngine())
    seen = []

    class Spy(measure.Server):
        def __init__(self, spec, log_path):
            seen.append(spec)
            super().__init__(spec, log_path)

    monkeypatch.setattr(measure, "Server", Spy)
    spec = HostEnvEngine().launch_spec({"delay_ms": 1}, cpu_ctx, host="127.0.0.1", port=1)
    wl = Workload(input_len=8, output_len=4, concurrency=1, requests=2, warmup_requests=0)
    measure_sides([Side("a", list(spec.argv), dict(spec.env))], "hostenv", cpu_ctx, wl, 1,
                  startup_timeout=60, log_dir=tmp_path)
    assert [s.host_env for s in seen] == [{"QTUNE_TEST_CACHE": "/shared"}]


OBJECTIVE_CASES = ["e2e_p99", "ttft_p50", "throughput", "goodput", "capacity", "pareto",
                   "pareto:ttft_p99"]


def _profile(objective: str, cpu_ctx, tmp_path):
    from qtune.profile import Profile

    spec = FakeEngine().launch_spec({"delay_ms": 1}, cpu_ctx, host="127.0.0.1", port=8000)
    wl = Workload(input_len=8, output_len=6, concurrency=2, requests=8, warmup_requests=0)
    best = 2.0 if objective == "capacity" else 1.0  # capacity: 2 streams held
    return Profile.model_validate({
        "name": "p", "created": "2026-12-01T00:00:00+00:00", "qtune_version": "0",
        "engine": {"name": "fake", "version": "1.0", "build": "cpu"},
        "model": cpu_ctx.model.summary(),
        "params": {"delay_ms": 1}, "env": dict(spec.env), "argv": list(spec.argv),
        "metrics": {"objective": {"name": objective, "best": best}},
        "workload": wl.to_dict(), "slo": ["e2e_p99<=5000ms"], "host": {},
        "study": {"storage": "journal", "name": "s", "trial": 1, "trials_run": 2},
    })


@pytest.mark.parametrize("objective", OBJECTIVE_CASES)
def test_verify_gives_a_verdict_for_every_objective(objective, monkeypatch, cpu_ctx,
                                                     tmp_path):
    """Before: verify looked the objective up as a per-run metric, which is
    None for goodput, capacity and pareto, so no verdict was printed."""
    import qtune.verify as verify

    monkeypatch.setitem(ENGINES, "fake", FakeEngine())
    monkeypatch.setattr(verify, "profile_context", lambda profile: cpu_ctx)
    res = verify.verify(_profile(objective, cpu_ctx, tmp_path), None, 3,
                        log_dir=tmp_path, startup_timeout=60)
    judged = res["judged_by"]
    row = res["metrics"][judged]
    assert row["gain"]["ratio"] > 0 and row["gain"]["ci95"] is not None
    # The profile's delay is 1 ms a token against the defaults' 10 ms: a
    # latency objective must come out better for the profile.
    if judged.startswith(("e2e", "ttft", "tpot")):
        assert row["gain"]["ratio"] > 1
    assert res["slo"] == ["e2e_p99<=5000ms"] and res["slo_met"] == {"profile": 3,
                                                                     "defaults": 3}
    if objective == "capacity":
        assert res["at_load"] == "concurrency 2"
    from qtune import console

    console.render_verify(res)  # prints the verdict line without error
