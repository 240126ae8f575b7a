"""``--format prometheus-rules`` against the real ``promtool``: the rules load
(``check rules``), and an alert fires on a synthetic series that breaks the
profile's SLO and stays silent on one that keeps it (``test rules``)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.emit import emit
from qtune.emit.prometheus import promql_string, rules
from qtune.errors import InputError
from tests.fakes.profile import sample_profile


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("QTUNE_REQUIRE_VLLM"):  # CI: scripts/test.sh installs it
            pytest.fail("promtool not installed (scripts/test.sh installs Debian's prometheus)")
        pytest.skip("promtool not installed (scripts/test.sh installs it)")
    return tool


def _profile(**over):
    base = dict(
        name="tiny-slo",
        model={"id": "tiny", "path": "/m", "served_name": "tiny"},
        slo=["ttft_p99<=1000ms", "tpot_p99<=30ms", "e2e_mean<=4s"],
        metrics={"objective": {"name": "capacity", "direction": "maximize",
                               "best": 22.0, "baseline": 15.0}, "startup_s": 40.0,
                 "best": {"server": {"preemptions": 0}}},
        workload={"input_len": 1024, "rate": None},
    )
    base.update(over)
    return sample_profile(**base)


def _check(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yml"
    path.write_text(text)
    r = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def test_rules_pass_promtool_check(tmp_path):
    text = emit(_profile(), "prometheus-rules")
    _check(tmp_path, text)
    doc = yaml.safe_load(text)
    alerts = {r["alert"]: r for r in doc["groups"][0]["rules"] if "alert" in r}
    assert set(alerts) == {f"TinySlo{a}" for a in (
        "TTFTP99OverSLO", "TPOTP99OverSLO", "E2EMEANOverSLO", "NearCapacity",
        "QueueGrowing", "KVCacheNearFull", "Preempting", "Down")}
    ttft = alerts["TinySloTTFTP99OverSLO"]
    assert ttft["expr"].endswith("> 1")  # 1000 ms, in the histogram's seconds
    assert "ttft_p99<=1000ms" in ttft["annotations"]["threshold_from"]
    cap = alerts["TinySloNearCapacity"]
    assert cap["expr"].endswith("> 17.6")  # 80% of the measured 22 req/s
    assert "capacity 22 req/s" in cap["annotations"]["threshold_from"]


def test_without_slo_thresholds_come_from_measured_p99(tmp_path):
    prof = _profile(slo=[], metrics={
        "objective": {"name": "e2e_p99", "direction": "minimize", "best": 800.0,
                      "baseline": 900.0},
        "best": {"e2e_ms": {"p99": 800.0}, "ttft_ms": {"p99": 120.0},
                 "request_throughput": 7.5}}, workload={"rate": 8.0})
    text = emit(prof, "prometheus-rules")
    _check(tmp_path, text)
    alerts = {r["alert"]: r for r in yaml.safe_load(text)["groups"][0]["rules"]
              if "alert" in r}
    assert alerts["TinySloE2EP99OverSLO"]["expr"].endswith("> 1")  # 800 ms +25%
    assert "measured e2e p99 800.0 ms" in \
        alerts["TinySloE2EP99OverSLO"]["annotations"]["threshold_from"]
    assert "TinySloTPOTP99OverSLO" not in alerts  # nothing measured, nothing made up
    near = alerts["TinySloNearCapacity"]
    assert near["expr"].endswith("> 6")  # 80% of the 7.5 served, not of the 8 offered
    assert "not a capacity" in near["annotations"]["threshold_from"]


def _bucket_series(le_fast: float, per_min_fast: int, per_min_slow: int) -> list[dict]:
    name = "vllm:time_to_first_token_seconds_bucket"
    total = per_min_fast + per_min_slow
    return [
        {"series": f'{name}{{le="{le_fast}",model_name="tiny"}}',
         "values": f"0+{per_min_fast}x40"},
        {"series": f'{name}{{le="2",model_name="tiny"}}', "values": f"0+{total}x40"},
        {"series": f'{name}{{le="+Inf",model_name="tiny"}}', "values": f"0+{total}x40"},
    ]


def test_slo_alert_fires_on_a_breach_and_not_otherwise(tmp_path):
    text = emit(_profile(), "prometheus-rules")
    rules_path = _check(tmp_path, text)
    ann = {r["alert"]: r["annotations"] for r in yaml.safe_load(text)["groups"][0]["rules"]
           if "alert" in r}
    labels = {"model_name": "tiny", "qtune_profile": "tiny-slo", "severity": "page"}
    tests = {"rule_files": [rules_path.name], "evaluation_interval": "1m", "tests": [
        {   # every request's first token between 0.5 s and 2 s: p99 ~2 s > 1 s
            "interval": "1m", "input_series": _bucket_series(0.5, 0, 100),
            "alert_rule_test": [
                {"eval_time": "8m", "alertname": "TinySloTTFTP99OverSLO", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "TinySloTTFTP99OverSLO",
                 "exp_alerts": [{"exp_labels": labels,
                                 "exp_annotations": ann["TinySloTTFTP99OverSLO"]}]}]},
        {   # all under 0.5 s: p99 ~0.5 s, inside the SLO
            "interval": "1m", "input_series": _bucket_series(0.5, 100, 0),
            "alert_rule_test": [{"eval_time": "30m", "alertname": "TinySloTTFTP99OverSLO",
                                 "exp_alerts": []}]},
        {   # 20 req/s completed against a capacity of 22: above 80%, fires
            "interval": "1m", "input_series": [
                {"series": 'vllm:request_success_total{model_name="tiny",finished_reason="stop"}',
                 "values": "0+1200x40"},
                {"series": 'vllm:num_requests_running{model_name="tiny"}',
                 "values": "1x40"}],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "TinySloNearCapacity", "exp_alerts": [
                    {"exp_labels": {**labels, "severity": "warn"},
                     "exp_annotations": ann["TinySloNearCapacity"]}]},
                {"eval_time": "30m", "alertname": "TinySloDown", "exp_alerts": []}]},
        {   # 10 req/s: fine; and another model's series do not count
            "interval": "1m", "input_series": [
                {"series": 'vllm:request_success_total{model_name="tiny"}',
                 "values": "0+600x40"},
                {"series": 'vllm:request_success_total{model_name="other"}',
                 "values": "0+6000x40"}],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "TinySloNearCapacity", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "TinySloDown",
                 "exp_alerts": [{"exp_labels": {"qtune_profile": "tiny-slo",
                                                "severity": "page",
                                                "model_name": "tiny"},
                                 "exp_annotations": ann["TinySloDown"]}]}]},
    ]}
    test_path = tmp_path / "rules_test.yml"
    test_path.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run([_promtool(), "test", "rules", str(test_path)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hostile_served_name_stays_inside_its_matcher(tmp_path):
    evil = 'x"} or vector(1) or {a="'
    text = emit(_profile(model={"id": "m", "path": "/m", "served_name": evil}),
                "prometheus-rules")
    _check(tmp_path, text)
    exprs = [r["expr"] for r in yaml.safe_load(text)["groups"][0]["rules"]]
    assert all("or vector(1)" not in e.replace(promql_string(evil), "") for e in exprs)


def test_engine_without_adapter_is_refused():
    with pytest.raises(InputError, match="no adapter for engine"):
        rules(_profile(engine={"name": "mystery", "version": "1", "build": "cpu"}))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_promql_string_round_trips(text):
    lit = promql_string(text)
    assert lit.startswith('"') and lit.endswith('"')
    # Python's string literal reads the escapes PromQL's lexer writes (Go's);
    # promtool itself reads them in tests/emit/test_grafana.py
    assert ast.literal_eval(lit) == text
    inner = lit[1:-1].replace("\\\\", "")
    assert '"' not in inner.replace('\\"', "")  # no unescaped quote closes it early
    assert "\n" not in lit


def test_a_template_in_the_served_name_is_printed_not_run(tmp_path):
    """Issue 28: Prometheus expands annotations as Go templates (with
    ``query``).  promtool's own test expands them: the alert's summary must
    come back holding the name's text, braces and all, as written."""
    evil = '{{ query "up" }}{{ $labels }}{x}'
    text = emit(_profile(model={"id": "m", "path": "/m", "served_name": evil}),
                "prometheus-rules")
    rules_path = _check(tmp_path, text)
    summary = f"time to first token p99 over 1000 ms for 10m ({evil})"
    tests = {"rule_files": [rules_path.name], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [
            {"series": f"vllm:time_to_first_token_seconds_bucket{{model_name={s},le=\"{le}\"}}",
             "values": f"0+{n}x40"}
            for s in [promql_string(evil)] for le, n in (("0.5", 0), ("2.0", 100),
                                                          ("+Inf", 100))],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "TinySloTTFTP99OverSLO",
                             "exp_alerts": [{"exp_labels": {
                                 "model_name": evil, "qtune_profile": "tiny-slo",
                                 "severity": "page"},
                                 "exp_annotations": {
                                     "summary": summary,
                                     "threshold_from": "the profile's SLO ttft_p99<=1000ms"}}]}],
    }]}
    test_path = tmp_path / "rules_test.yml"
    test_path.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run([_promtool(), "test", "rules", str(test_path)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("metrics", [
    {"objective": {"name": "e2e_p99", "direction": "minimize", "best": 1.0},
     "best": {"request_throughput": float("inf"), "e2e_ms": {"p99": float("inf")}}},
    {"objective": {"name": "e2e_p99", "direction": "minimize", "best": 1.0},
     "best": {"request_throughput": 1e300, "ttft_ms": {"p99": 1e300}}},
])
def test_numbers_no_alert_can_use_are_left_out(metrics, tmp_path):
    """Issue 28: ``inf`` or 1e300 in the free-form measurements gave alerts
    that can never fire: a profile holding one is refused when it is read
    (every number finite and within +-1e15), so no alert is written from it."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite number"):
        _profile(slo=[], metrics=metrics)
