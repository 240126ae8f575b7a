"""``--format kubernetes --autoscale hpa``: the HPA scales on completed
requests per pod at 80% of the profile's measured rate, waits the measured
start before another scale-up, and passes the Kubernetes API schema."""

from __future__ import annotations

import pytest
import yaml

from qtune.emit import emit
from qtune.errors import InputError
from tests.emit.test_kubernetes import service_monitor_validator
from tests.fakes.profile import sample_profile


def _capacity_profile(**over):
    return sample_profile(
        metrics={"objective": {"name": "capacity", "direction": "maximize", "best": 22.0,
                               "baseline": 15.0}, "startup_s": 217.4},
        model={"id": "tiny", "path": "/m", "served_name": "tiny"}, **over)


def test_hpa_from_measured_capacity_passes_the_schema():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="the test extra installs kubernetes-validate")
    text = emit(_capacity_profile(), "kubernetes", autoscale="hpa", max_replicas=6)
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            service_monitor_validator().validate(doc)
        else:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(),
                                         strict=True)
    deploy, _, _, hpa, _ = docs
    assert hpa["kind"] == "HorizontalPodAutoscaler"
    assert "replicas" not in deploy["spec"]  # the HPA owns the count
    spec = hpa["spec"]
    assert spec["maxReplicas"] == 6 and spec["scaleTargetRef"]["name"] == deploy[
        "metadata"]["name"]
    assert spec["metrics"][0]["pods"]["target"]["averageValue"] == "17600m"  # 0.8 x 22
    # 60 s of stabilisation, one pod per measured start: a pod serves after
    # 218 s + at most 60 s, not after 2 x 218 s
    assert spec["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 60
    assert spec["behavior"]["scaleUp"]["policies"][0]["periodSeconds"] == 218
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "80% of capacity 22 req/s" in text
    assert "vllm:request_success_total{model_name=\"tiny\"}" in text  # adapter rule


def test_without_autoscale_the_deployment_keeps_one_replica():
    docs = list(yaml.safe_load_all(emit(_capacity_profile(), "kubernetes")))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "NetworkPolicy"]
    assert docs[0]["spec"]["replicas"] == 1


@pytest.mark.parametrize(("fmt", "kwargs", "needle"), [
    ("systemd", {"autoscale": "hpa"}, "no autoscaler"),
    ("kubernetes", {"autoscale": "cpu"}, "unknown autoscaler"),
])
def test_bad_autoscale(fmt, kwargs, needle):
    with pytest.raises(InputError, match=needle):
        emit(_capacity_profile(), fmt, **kwargs)


def test_no_measured_rate_no_hpa():
    prof = sample_profile(metrics={"objective": {"name": "e2e_p99", "direction": "minimize",
                                                 "best": 1.0, "baseline": 2.0}})
    with pytest.raises(InputError, match="no measured rate"):
        emit(prof, "kubernetes", autoscale="hpa")
