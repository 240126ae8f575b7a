"""``--format grafana``: the dashboard passes Grafana's own JSON schemas (the
dashboard kind, the time series panel's options and field config, the
Prometheus query; vendored from grafana-foundation-sdk, see
tests/fixtures/grafana/SOURCE.md), every panel's PromQL loads in the real
``promtool check rules`` and computes what its title says in ``promtool test
rules``, and the SLO and measured capacity are drawn as thresholds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from qtune.emit import emit
from qtune.emit.grafana import uid
from qtune.emit.prometheus import promql_string
from qtune.engines import ENGINES
from qtune.errors import InputError
from tests.emit.test_prometheus import _profile, _promtool
from tests.fakes.profile import sample_profile

SCHEMAS = Path(__file__).parents[1] / "fixtures" / "grafana"


def _schema(name: str, definition: str | None = None) -> jsonschema.protocols.Validator:
    doc = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    if name == "dashboard":
        # The one gap between the generated schema and Grafana: a threshold's
        # base step is -Infinity, which JSON writes as null (the schema's own
        # description says so: "Nulls currently appear here when serializing
        # -Infinity to JSON"; the SDK's model types it Optional[float]).
        value = doc["definitions"]["Threshold"]["properties"]["value"]
        assert value["type"] == "number" and "Nulls currently appear" in value["description"]
        value["type"] = ["number", "null"]
    if definition is not None:  # one definition, its $refs resolved in the file
        doc = {**doc, "$ref": f"#/definitions/{definition}"}
    cls = jsonschema.validators.validator_for(doc)
    cls.check_schema(doc)
    return cls(doc)


DASHBOARD = _schema("dashboard")
OPTIONS = _schema("timeseries", "Options")
CUSTOM = _schema("timeseries", "FieldConfig")
QUERY = _schema("prometheus")


def validate(board: dict) -> None:
    DASHBOARD.validate(board)
    for panel in board["panels"]:
        assert panel["type"] == "timeseries"
        OPTIONS.validate(panel["options"])
        CUSTOM.validate(panel["fieldConfig"]["defaults"].get("custom", {}))
        for target in panel["targets"]:
            QUERY.validate(target)


def exprs(board: dict) -> dict[str, str]:
    """Every panel query as ``record name -> expr``."""
    return {f"panel_{i}_{t['refId']}": t["expr"]
            for i, p in enumerate(board["panels"]) for t in p["targets"]}


def promtool_check(tmp_path: Path, board: dict) -> Path:
    """The panels' queries as recording rules, through ``promtool check rules``
    (which parses each expression with Prometheus' own PromQL parser)."""
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": name, "expr": expr} for name, expr in exprs(board).items()]}]}
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    r = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def by_title(board: dict) -> dict[str, dict]:
    return {p["title"]: p for p in board["panels"]}


def lines(panel: dict) -> list[tuple[float, str]]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[0] == {"value": None, "color": "green"}  # the base step
    return [(s["value"], s["color"]) for s in steps[1:]]


def test_dashboard_passes_grafanas_schemas_and_promtool(tmp_path):
    board = json.loads(emit(_profile(), "grafana"))
    validate(board)
    promtool_check(tmp_path, board)
    assert board["title"] == "qtune: tiny-slo (tiny)"
    assert board["uid"] == uid(_profile()) and len(board["uid"]) <= 40
    var = board["templating"]["list"][0]
    assert (var["type"], var["name"], var["query"]) == ("datasource", "datasource",
                                                        "prometheus")
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
    panels = by_title(board)
    assert set(panels) == {
        "Time to first token (TTFT)", "Time per output token (TPOT)",
        "End-to-end latency (E2E)", "Completed requests per second",
        "Requests running and waiting", "KV-cache use (fullest replica)",
        "Preemptions per second", "Prefix-cache hit rate"}
    # the SLO, in the histograms' seconds
    assert lines(panels["Time to first token (TTFT)"]) == [(1.0, "red")]
    assert lines(panels["Time per output token (TPOT)"]) == [(0.03, "red")]
    assert lines(panels["End-to-end latency (E2E)"]) == [(4.0, "red")]
    ttft = panels["Time to first token (TTFT)"]
    assert ttft["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
    assert [t["legendFormat"] for t in ttft["targets"]] == ["p50", "p90", "p99"]
    # 80% of the measured 22 req/s (the NearCapacity alert's line), and 22
    rate = panels["Completed requests per second"]
    assert lines(rate) == [(pytest.approx(17.6), "orange"), (22.0, "red")]
    assert "capacity 22 req/s" in rate["description"]
    assert lines(panels["KV-cache use (fullest replica)"]) == [(0.95, "orange")]
    assert panels["Preemptions per second"]["fieldConfig"]["defaults"]["custom"][
        "thresholdsStyle"]["mode"] == "off"


def test_without_slo_the_lines_are_the_alerts_measured_p99(tmp_path):
    prof = _profile(slo=[], metrics={
        "objective": {"name": "e2e_p99", "direction": "minimize", "best": 800.0,
                      "baseline": 900.0},
        "best": {"e2e_ms": {"p99": 800.0}, "request_throughput": 7.5}},
        workload={"rate": 8.0})
    board = json.loads(emit(prof, "grafana"))
    validate(board)
    panels = by_title(board)
    assert lines(panels["End-to-end latency (E2E)"]) == [(1.0, "red")]  # 800 ms +25%
    assert lines(panels["Time to first token (TTFT)"]) == []  # nothing measured
    assert lines(panels["Completed requests per second"]) == [
        (pytest.approx(6.0), "orange"), (7.5, "red")]
    assert "not a capacity" in panels["Completed requests per second"]["description"]


def test_panels_compute_what_they_say(tmp_path):
    """``promtool test rules`` evaluates the panels' queries on synthetic
    series: the served model's alone, the hit rate as a share."""
    board = json.loads(emit(_profile(), "grafana"))
    path = promtool_check(tmp_path, board)
    names = {p["title"]: f"panel_{i}_" for i, p in enumerate(board["panels"])}
    series = [
        # 12 req/s completed for tiny, 100 for another model on the same Prometheus
        ('vllm:request_success_total{model_name="tiny"}', "0+720x20"),
        ('vllm:request_success_total{model_name="other"}', "0+6000x20"),
        # two replicas of tiny: 3 + 4 waiting; KV cache 0.5 and 0.9 full
        ('vllm:num_requests_waiting{model_name="tiny",engine="0"}', "3x20"),
        ('vllm:num_requests_waiting{model_name="tiny",engine="1"}', "4x20"),
        ('vllm:kv_cache_usage_perc{model_name="tiny",engine="0"}', "0.5x20"),
        ('vllm:kv_cache_usage_perc{model_name="tiny",engine="1"}', "0.9x20"),
        # 1 in 4 prompt tokens from the prefix cache
        ('vllm:prefix_cache_queries_total{model_name="tiny"}', "0+400x20"),
        ('vllm:prefix_cache_hits_total{model_name="tiny"}', "0+100x20"),
    ]
    tests = {"rule_files": [path.name], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": rec, "eval_time": "10m",
             "exp_samples": [{"labels": f'{rec}{{model_name="tiny"}}', "value": value}]}
            for rec, value in (
                (names["Completed requests per second"] + "A", 12),
                (names["Requests running and waiting"] + "B", 7),
                (names["KV-cache use (fullest replica)"] + "A", 0.9),
                (names["Prefix-cache hit rate"] + "A", 0.25))],
    }]}
    test_path = tmp_path / "panels_test.yml"
    test_path.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run([_promtool(), "test", "rules", str(test_path)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def _served(name: str):
    try:
        return sample_profile(name="tiny-slo", slo=["ttft_p99<=1000ms"],
                              model={"id": "m", "path": "/m", "served_name": name},
                              metrics={"objective": {"name": "capacity",
                                                     "direction": "maximize", "best": 22.0,
                                                     "baseline": 15.0}})
    except ValidationError:
        return None  # the profile refuses it first (control characters, line breaks)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=1))
def test_hostile_served_name_breaks_neither_json_nor_promql(tmp_path, name):
    prof = _served(name)
    if prof is None:
        return
    text = emit(prof, "grafana")
    board = json.loads(text)  # the JSON holds
    validate(board)
    # the name changes the matcher's string literal and nothing else
    reference = exprs(json.loads(emit(_served("PLACEHOLDER"), "grafana")))
    for key, expr in exprs(board).items():
        assert expr.replace(literal(name), promql_string("PLACEHOLDER")) == reference[key]
    promtool_check(tmp_path, board)
    # Grafana interpolates $x, ${x} and [[x]]: none but ${datasource} is left
    assert "$" not in text.replace("${datasource}", "") and "[[" not in text


def literal(name: str) -> str:
    """The name's PromQL literal as the dashboard writes it (Grafana's
    variable syntax written with Go escapes, which PromQL reads back)."""
    return promql_string(name).replace("$", "\\x24").replace("[[", "[\\x5b")


@pytest.mark.parametrize("evil", ["${__user.login}", "$datasource", "[[v]]", "a$$b"])
def test_grafana_variables_in_a_served_name_are_not_interpolated(tmp_path, evil):
    """Issue 28: Grafana expands ``${...}``, ``$x`` and ``[[x]]`` in names and
    queries.  The queries still select the name exactly (promtool parses the
    escaped literal back to it), and no text carries a variable reference."""
    text = emit(_profile(model={"id": "m", "path": "/m", "served_name": evil}), "grafana")
    board = json.loads(text)
    validate(board)
    promtool_check(tmp_path, board)
    assert "$" not in text.replace("${datasource}", "") and "[[" not in text
    for expr in exprs(board).values():
        assert literal(evil) in expr
        # PromQL's lexer reads Go escapes as Python's does: the same name
        assert __import__("ast").literal_eval(literal(evil)) == evil


@pytest.mark.parametrize("evil", [
    'x"} or vector(1) or {a="',
    "\U00010000",  # JSON's surrogate pair \ud800\udc00 is no code point to PromQL
    "back\\slash\\",
])
def test_hostile_served_name_is_one_matcher(tmp_path, evil):
    board = json.loads(emit(_profile(model={"id": "m", "path": "/m", "served_name": evil}),
                            "grafana"))
    validate(board)
    promtool_check(tmp_path, board)
    assert all(e.count(promql_string(evil)) >= 1 and
               "vector(1)" not in e.replace(promql_string(evil), "")
               for e in exprs(board).values())
    assert board["title"] == f"qtune: tiny-slo ({evil})".replace("$", "\uff04")


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_gets_a_valid_dashboard_of_what_it_exports(tmp_path, engine):
    """Panels only for the series the engine's adapter names (TGI has no
    KV-cache gauge, SGLang no histograms here): none drawn on nothing, and
    no dashboard for an engine that serves no metrics (transformers)."""
    profile = _profile(engine={"name": engine, "version": "1.0", "build": "cuda"})
    if ENGINES[engine].metric_names() is None:
        with pytest.raises(InputError, match="names no metrics"):
            emit(profile, "grafana")
        return
    board = json.loads(emit(profile, "grafana"))
    validate(board)
    promtool_check(tmp_path, board)
    names = ENGINES[engine].metric_names()
    assert names is not None
    titles = set(by_title(board))
    assert ("KV-cache use (fullest replica)" in titles) == (names.kv_cache_usage is not None)
    assert ("Time to first token (TTFT)" in titles) == (names.ttft_seconds is not None)
    assert ("Completed requests per second" in titles) == \
        (names.request_success is not None)
