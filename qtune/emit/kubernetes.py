"""Kubernetes Deployment and Service for a profile (see ``container`` for
what changes between the host and the container).

- GPUs as the ``nvidia.com/gpu`` extended resource (requests = limits);
- ``/dev/shm`` as a memory-backed emptyDir (a pod's default is 64 MB);
- a startupProbe sized from the tuned start time, so the kubelet does not
  kill a server that is still loading (vLLM's guide names that failure), then
  readiness and liveness on ``/health``;
- ``Recreate``: a rolling update would need the GPUs twice;
- the model folder is a hostPath, as tuned on this host: use a PVC where the
  model lives on shared storage;
- ``HF_TOKEN`` from an optional Secret ``hf-token`` (key ``token``);
- with ``--autoscale hpa``, a HorizontalPodAutoscaler on completed requests
  per second per pod (CPU use says nothing about an LLM server) at 80% of
  the profile's capacity, its scale-up stabilisation the measured start;
  with ``--autoscale keda``, a KEDA ScaledObject on the same figures, its
  Prometheus trigger on the engine's own counter (no Prometheus Adapter).
"""

from __future__ import annotations

import math
from typing import Any

from qtune.emit.container import Container, container_view, dump
from qtune.errors import InputError
from qtune.profile import Profile


def shm_gib(c: Container) -> int:
    """/dev/shm for the pod: PyTorch passes tensors between the API server and
    engine processes (and TP ranks) through it; vLLM's Kubernetes guide uses
    2Gi for one GPU, so 2Gi per GPU, 2Gi at least."""
    return 2 * max(1, c.gpus)


def probe_failures(c: Container, period_s: int) -> int:
    return max(1, math.ceil(c.start_timeout_s / period_s))


def _esc(value: str) -> str:
    """Kubernetes expands ``$(VAR)`` in command, args and env values, and
    reads ``$$`` as ``$`` wherever it stands: so every ``$`` is doubled
    (escaping only ``$(`` turned ``a$$(T)b`` into ``a$$$(T)b``, which expands
    to ``a$`` + the value of T + ``b``)."""
    return value.replace("$", "$$")


# The pod metric the HPA reads; Prometheus Adapter makes it from the
# engine's request counter (the rule is in the manifest's header).
HPA_METRIC = "qtune_requests_per_second"
AUTOSCALERS = ("hpa", "keda")
# Where KEDA's operator asks Prometheus, unless --prometheus-url says: the
# Service that kube-prometheus-stack (the Prometheus Operator) creates.
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "qtune"}


def _prometheus(url: str) -> str:
    """--prometheus-url as it may stand in a manifest: an http(s) URL, no
    password (a deploy file is read by many; KEDA takes credentials from a
    TriggerAuthentication)."""
    from urllib.parse import urlsplit

    from qtune.bench import check_url

    check_url(url, "--prometheus-url")
    if urlsplit(url).password is not None:
        raise InputError("--prometheus-url: holds a password, which would be written "
                         "into the manifest", hint="give the URL without credentials and "
                         "reference a KEDA TriggerAuthentication from the trigger")
    return url


def autoscaler(profile: Profile, name: str, max_replicas: int, kind: str = "hpa",
               prometheus_url: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The HPA (or KEDA ScaledObject) document and the header lines that say
    what it rests on.  Both scale on completed requests per second per pod
    at 80% of the measured rate, and wait the measured start before another
    scale-up."""
    from qtune.emit.prometheus import CAPACITY_SHARE, capacity, model_matcher, signals

    cap = capacity(profile)
    if cap is None:
        raise InputError("--autoscale: the profile holds no measured rate to scale on",
                         hint="tune with --objective capacity, or any objective at a "
                         "fixed --rate")
    value, source = cap
    matcher, counter = model_matcher(profile, "kubernetes --autoscale")
    start = int(math.ceil(float(profile.metrics.get("startup_s") or 0)))
    per_pod = value * CAPACITY_SHARE
    settle = min(3600, max(start, 60))
    behavior = {
        # a new pod serves only after its start: do not add another on the
        # same burst before the first could help
        "scaleUp": {"stabilizationWindowSeconds": settle},
        "scaleDown": {"stabilizationWindowSeconds": 600},
    }
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    what = "HPA" if kind == "hpa" else "KEDA"
    head = [
        f"{what}: scale at {per_pod:.3g} completed req/s per pod = {CAPACITY_SHARE:.0%} of "
        f"{source}",
        f"{what}: scale-up stabilisation {settle} s from the measured start ({start} s)",
    ]
    if kind == "keda":
        # The trigger's query is the deployment's total; AverageValue divides
        # it by the replica count, so the threshold is per pod, as the HPA's.
        query = signals(profile, "kubernetes --autoscale").rate()
        server = DEFAULT_PROMETHEUS if prometheus_url is None else _prometheus(prometheus_url)
        scaled = {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": name, "labels": _labels(name)},
            "spec": {
                "scaleTargetRef": target,
                "minReplicaCount": 1,
                "maxReplicaCount": max_replicas,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
                "triggers": [{"type": "prometheus", "metricType": "AverageValue",
                              "metadata": {"serverAddress": server, "query": str(query),
                                           "threshold": f"{per_pod:.6g}"}}],
            },
        }
        head.append(f"KEDA: asks the Prometheus at {server}" + (
            "" if prometheus_url else " (the Prometheus Operator's Service; set "
            "--prometheus-url for another)") + " for the deployment's total rate")
        return scaled, head
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": HPA_METRIC},
                "target": {"type": "AverageValue",
                           "averageValue": f"{int(per_pod * 1000)}m"}}}],
            "behavior": behavior,
        },
    }
    head.append(
        f"HPA: needs Prometheus Adapter to serve the pod metric {HPA_METRIC}: rule "
        f"seriesQuery '{counter}_total{matcher}', name.as '{HPA_METRIC}', metricsQuery "
        f"'sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[2m])) by (<<.GroupBy>>)'")
    return hpa, head


def render(profile: Profile, image: str | None = None, autoscale: str | None = None,
           max_replicas: int = 4, prometheus_url: str | None = None) -> str:
    c = container_view(profile, image)
    labels = _labels(c.name)
    env: list[dict[str, Any]] = [{"name": k, "value": _esc(v)} for k, v in c.env.items()]
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf-token", "key": "token", "optional": True}}})
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib(c)}Gi"}}]
    for m in c.mounts:
        mounts.append({"name": m.name, "mountPath": m.container, "readOnly": True})
        volumes.append({"name": m.name, "hostPath": {"path": m.host, "type": "Directory"}})
    for cache in c.caches:
        mounts.append({"name": cache.name, "mountPath": cache.path})
        volumes.append({"name": cache.name, "emptyDir": {}})
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "engine",
        "image": c.image,
        "command": [_esc(a) for a in c.command],
        "args": [_esc(a) for a in c.args],
        "env": env,
        "ports": [{"name": "http", "containerPort": c.port}],
        "volumeMounts": mounts,
        "startupProbe": {**health, "periodSeconds": 10,
                         "failureThreshold": probe_failures(c, 10)},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
    }
    if c.gpus:
        gpus = {"nvidia.com/gpu": str(c.gpus)}
        container["resources"] = {"limits": gpus, "requests": dict(gpus)}
    spec: dict[str, Any] = {
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": {"app.kubernetes.io/name": c.name}},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container], "volumes": volumes,
                     "terminationGracePeriodSeconds": 120},
        },
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": c.name, "labels": labels}, "spec": spec}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": c.name, "labels": labels},
        "spec": {"selector": {"app.kubernetes.io/name": c.name},
                 "ports": [{"name": "http", "port": c.port, "targetPort": "http"}]},
    }
    docs = [deployment, service]
    head = list(c.header)
    if autoscale is not None:
        if autoscale not in AUTOSCALERS:
            raise InputError(f"--autoscale: unknown autoscaler {autoscale!r}",
                             hint="available: " + ", ".join(AUTOSCALERS))
        scaler, lines = autoscaler(profile, c.name, max_replicas, autoscale, prometheus_url)
        docs.append(scaler)
        head += lines
        del spec["replicas"]  # the autoscaler owns the count
    if c.cpus:
        head.append(f"NUMA: tuned on CPUs {c.cpus}; in Kubernetes, the kubelet's "
                    "Topology Manager (single-numa-node) places the pod")
    return dump(head, docs)
