"""Kubernetes Deployment and Service for a profile (see ``container`` for
what changes between the host and the container).

- GPUs as the ``nvidia.com/gpu`` extended resource (requests = limits);
- ``/dev/shm`` as a memory-backed emptyDir (a pod's default is 64 MB);
- a startupProbe sized from the tuned start time, so the kubelet does not
  kill a server that is still loading (vLLM's guide names that failure), then
  readiness and liveness on ``/health``;
- one replica: ``Recreate`` (a rolling update would need the GPUs twice);
  with an autoscaler: ``RollingUpdate``, one pod more at a time and none
  taken down before its replacement serves (``maxSurge: 1``,
  ``maxUnavailable: 0``: one pod's GPUs free for the rollout), so a rollout
  never takes every replica down for the start time (247 s on the H200);
- requests and limits: GPUs, the shared memory (a memory-backed emptyDir
  counts against the pod's memory), host memory and CPUs (``resources``);
- a restrictive security context the engine runs under: a non-root user,
  no privilege escalation, every capability dropped, the runtime's seccomp
  profile, a read-only root filesystem with emptyDirs for ``/tmp``, the home
  and the engine's caches (the home moves from /root, which a non-root user
  cannot enter, to ``HOME``);
- the pod carries ``prometheus.io/*`` scrape annotations, and with an
  autoscaler (which reads the engine's counter through Prometheus) a
  ServiceMonitor for the Prometheus Operator;
- the model folder is a hostPath, as tuned on this host: use a PVC where the
  model lives on shared storage;
- the Hugging Face token from an optional Secret ``hf-token`` (key
  ``token``), mounted as a file that ``HF_TOKEN_PATH`` names (a secret in an
  environment variable is visible to every process and crash dump);
- a NetworkPolicy that lets traffic reach only the serving port;
- with ``--autoscale hpa``, a HorizontalPodAutoscaler on completed requests
  per second per pod (CPU use says nothing about an LLM server) at 80% of
  the profile's capacity, with a short scale-up stabilisation (a pod still
  starting counts as no load, so the HPA does not add a second pod for the
  same burst, and a window of the start time on top doubled the delay);
  with ``--autoscale keda``, a KEDA ScaledObject on the same figures, its
  Prometheus trigger on the engine's own counter (no Prometheus Adapter).
"""

from __future__ import annotations

import math
from typing import Any

from qtune.emit.container import (
    HOME,
    UID,
    Container,
    container_view,
    dump,
    nonroot_env,
    rehome,
    shm_gib,
    sizing,
)
from qtune.errors import InputError
from qtune.profile import Profile


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
SCALE_UP_WINDOW_S = 60
TOKEN_DIR = "/var/run/secrets/huggingface"


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
    behavior = {
        # The rate is already a 2-minute average (the adapter rule, the KEDA
        # query's window): a minute more filters one burst.  A window of the
        # start time (247 s on the H200) delayed the new pod by that much on
        # top of its own start, 2x before it served.
        "scaleUp": {"stabilizationWindowSeconds": SCALE_UP_WINDOW_S,
                    # at most one pod per start: the next decision sees it serve
                    "policies": [{"type": "Pods", "value": 1,
                                  "periodSeconds": min(1800, max(start, 60))}]},
        "scaleDown": {"stabilizationWindowSeconds": 600},
    }
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    what = "HPA" if kind == "hpa" else "KEDA"
    head = [
        f"{what}: scale at {per_pod:.3g} completed req/s per pod = {CAPACITY_SHARE:.0%} of "
        f"{source}",
        f"{what}: scale-up stabilisation {SCALE_UP_WINDOW_S} s, at most one pod per "
        f"{min(1800, max(start, 60))} s (the measured start: {start} s)",
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


def resources(profile: Profile, c: Container) -> tuple[dict[str, Any], list[str]]:
    """requests and limits (``container.sizing``: where the figures come
    from), and a header line saying so."""
    s = sizing(profile, c)
    req: dict[str, str] = {"cpu": str(s.cpu_req), "memory": f"{s.mem_req}Gi"}
    lim: dict[str, str] = {"cpu": str(s.cpu_lim), "memory": f"{s.mem_lim}Gi"}
    if c.gpus:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(c.gpus)
    return {"requests": req, "limits": lim}, [s.header]


def service_monitor(name: str) -> dict[str, Any]:
    """The Prometheus Operator's scrape of the Service's pods: the autoscaler
    and the alert rules read the engine's counters through Prometheus."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]},
    }


def render(profile: Profile, image: str | None = None, autoscale: str | None = None,
           max_replicas: int = 4, prometheus_url: str | None = None) -> str:
    if autoscale is not None and autoscale not in AUTOSCALERS:
        raise InputError(f"--autoscale: unknown autoscaler {autoscale!r}",
                         hint="available: " + ", ".join(AUTOSCALERS))
    c = container_view(profile, image, home=HOME)
    labels = _labels(c.name)
    env_all = {**nonroot_env(), **c.env}
    env: list[dict[str, Any]] = [{"name": k, "value": _esc(v)} for k, v in env_all.items()]
    env.append({"name": "HF_TOKEN_PATH", "value": f"{TOKEN_DIR}/token"})
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                    {"name": "tmp", "mountPath": "/tmp"},
                                    {"name": "home", "mountPath": HOME},
                                    {"name": "hf-token", "mountPath": TOKEN_DIR,
                                     "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib(c)}Gi"}},
        {"name": "tmp", "emptyDir": {}}, {"name": "home", "emptyDir": {}},
        {"name": "hf-token", "secret": {"secretName": "hf-token", "optional": True,
                                        "defaultMode": 0o440}}]
    for m in c.mounts:
        mounts.append({"name": m.name, "mountPath": m.container, "readOnly": True})
        volumes.append({"name": m.name, "hostPath": {"path": m.host, "type": "Directory"}})
    for cache in c.caches:
        mounts.append({"name": cache.name, "mountPath": rehome(cache.path)})
        volumes.append({"name": cache.name, "emptyDir": {}})
    health = {"httpGet": {"path": "/health", "port": "http"}}
    res, res_head = resources(profile, c)
    container: dict[str, Any] = {
        "name": "engine",
        "image": c.image,
        "command": [_esc(a) for a in c.command],
        "args": [_esc(a) for a in c.args],
        "env": env,
        "ports": [{"name": "http", "containerPort": c.port}],
        "volumeMounts": mounts,
        "resources": res,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "startupProbe": {**health, "periodSeconds": 10,
                         "failureThreshold": probe_failures(c, 10)},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
    }
    strategy: dict[str, Any] = {"type": "Recreate"}
    if autoscale is not None:
        strategy = {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    spec: dict[str, Any] = {
        "replicas": 1,
        "strategy": strategy,
        "selector": {"matchLabels": {"app.kubernetes.io/name": c.name}},
        "template": {
            "metadata": {"labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(c.port),
                "prometheus.io/path": "/metrics"}},
            "spec": {"containers": [container], "volumes": volumes,
                     # the server calls no Kubernetes API
                     "automountServiceAccountToken": False,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": UID,
                                         "runAsGroup": UID, "fsGroup": UID,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
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
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": c.name, "labels": labels},
        "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": c.name}},
                 "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"protocol": "TCP", "port": c.port}]}]},
    }
    docs: list[dict[str, Any]] = [deployment, service, policy]
    head = list(c.header) + res_head + [
        f"runs as uid {UID} (not root): the model's host folder must be readable by it"]
    if autoscale is not None:
        scaler, lines = autoscaler(profile, c.name, max_replicas, autoscale, prometheus_url)
        docs += [scaler, service_monitor(c.name)]
        head += lines + [
            "ServiceMonitor: the Prometheus Operator scrapes /metrics of every pod "
            "(the autoscaler reads the engine's counter through Prometheus)",
            "rollout: one pod more at a time" + (
                f" ({c.gpus} GPUs free for it)" if c.gpus else "")
            + ", none taken down before its replacement serves"]
        del spec["replicas"]  # the autoscaler owns the count
    if c.cpus:
        head.append(f"NUMA: tuned on CPUs {c.cpus}; in Kubernetes, the kubelet's "
                    "Topology Manager (single-numa-node) places the pod")
    return dump(head, docs)
