"""``--format kubernetes --autoscale keda``: a KEDA ScaledObject on the same
figures as the HPA (completed req/s per pod at 80% of the measured rate, the
measured start as the scale-up pace), valid against KEDA's own CRD
schema (v2.20.2, tests/fixtures/keda/SOURCE.md) with unknown fields refused,
and its trigger's query accepted by the real ``promtool``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from qtune.emit import emit
from qtune.emit.kubernetes import DEFAULT_PROMETHEUS
from qtune.emit.prometheus import promql_string
from qtune.errors import InputError
from tests.emit.test_prometheus import _promtool
from tests.fakes.profile import sample_profile


def _capacity_profile(served: str = "tiny"):
    return sample_profile(
        metrics={"objective": {"name": "capacity", "direction": "maximize", "best": 22.0,
                               "baseline": 15.0}, "startup_s": 217.4},
        model={"id": "tiny", "path": "/m", "served_name": served})


CRD = Path(__file__).parents[1] / "fixtures" / "keda" / "keda.sh_scaledobjects.yaml"


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as the API server's strict
    field validation refuses them: every object that lists its properties
    and neither allows other keys nor preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    assert schema["properties"]["spec"]["additionalProperties"] is False
    return jsonschema.Draft7Validator(schema)


def scaled_object(text: str) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "NetworkPolicy",
                                         "ScaledObject", "ServiceMonitor"]
    assert "replicas" not in docs[0]["spec"]  # the autoscaler owns the count
    return docs[3]


def test_scaledobject_passes_kedas_crd_schema(tmp_path):
    text = emit(_capacity_profile(), "kubernetes", autoscale="keda", max_replicas=6)
    so = scaled_object(text)
    crd_validator().validate(so)
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": so["metadata"]["name"]}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # a short window, one pod per measured start (217.4 s): not 2x the start
    assert behavior["scaleUp"] == {"stabilizationWindowSeconds": 60, "policies": [
        {"type": "Pods", "value": 1, "periodSeconds": 218}]}
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    meta = trigger["metadata"]
    assert meta["threshold"] == "17.6"  # 80% of the measured 22 req/s, per pod
    assert meta["serverAddress"] == DEFAULT_PROMETHEUS
    assert meta["query"] == ('sum by (model_name) (rate(vllm:request_success_total'
                             '{model_name="tiny"}[5m]))')
    assert "KEDA: scale at 17.6 completed req/s per pod = 80% of capacity 22 req/s" in text
    # the query is PromQL that Prometheus parses
    rules = tmp_path / "q.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": [
        {"record": "keda_query", "expr": meta["query"]}]}]}))
    r = subprocess.run([_promtool(), "check", "rules", str(rules)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_schema_check_refuses_an_unknown_field():
    """The strict schema is what catches a misspelt field (here the HPA's
    name for the replica bound), so the test above can fail."""
    so = scaled_object(emit(_capacity_profile(), "kubernetes", autoscale="keda"))
    so["spec"]["maxReplicas"] = 4
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        crd_validator().validate(so)


def test_prometheus_url_and_hostile_served_name():
    evil = 'x"} or vector(1) or {a="'
    prof = _capacity_profile(evil)
    so = scaled_object(emit(prof, "kubernetes", autoscale="keda",
                            prometheus_url="http://prom.obs.svc:9090"))
    crd_validator().validate(so)
    meta = so["spec"]["triggers"][0]["metadata"]
    assert meta["serverAddress"] == "http://prom.obs.svc:9090"
    assert "vector(1)" not in meta["query"].replace(promql_string(evil), "")


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"autoscale": "hpa", "prometheus_url": "http://p:9090"}, "only KEDA"),
    ({"prometheus_url": "http://p:9090"}, "only KEDA"),
    ({"autoscale": "keda", "prometheus_url": "http://u:S3cret@p:9090"}, "password"),
    ({"autoscale": "keda", "prometheus_url": "file:///etc/passwd"}, "not an http"),
])
def test_bad_prometheus_url(kwargs, needle):
    with pytest.raises(InputError, match=needle) as e:
        emit(_capacity_profile(), "kubernetes", **kwargs)
    assert "S3cret" not in str(e.value)


def test_no_measured_rate_no_scaledobject():
    prof = sample_profile(metrics={"objective": {"name": "e2e_p99", "direction": "minimize",
                                                 "best": 1.0, "baseline": 2.0}})
    with pytest.raises(InputError, match="no measured rate"):
        emit(prof, "kubernetes", autoscale="keda")


def test_cli_emits_both_new_formats(tmp_path, monkeypatch, capsys):
    """Through ``qtune emit`` as the console script runs it: --prometheus-url
    reaches the trigger, --format grafana prints the dashboard."""
    from tests.emit.test_hostile import run_emit

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_capacity_profile().model_dump(mode="json")))
    rc, out, _ = run_emit([str(path), "--format", "kubernetes", "--autoscale", "keda",
                           "--prometheus-url", "https://prom.example:9090"], monkeypatch,
                          capsys)
    assert rc == 0
    so = scaled_object(out)
    crd_validator().validate(so)
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == \
        "https://prom.example:9090"
    rc, out, _ = run_emit([str(path), "--format", "grafana", "--json"], monkeypatch, capsys)
    assert rc == 0
    board = json.loads(json.loads(out)["text"])
    assert board["title"] == "qtune: tiny-test (tiny)"
