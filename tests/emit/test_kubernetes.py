"""``--format kubernetes`` as an operator would deploy it (issue 29): resource
requests and limits, a restrictive security context, scrape annotations and a
ServiceMonitor when the autoscaler reads Prometheus, a rolling update with
one pod's GPUs of surge, mounts limited to model folders (issue 28), and the
policy checker operators run (Checkov's Kubernetes checks, when installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from qtune.emit import emit
from qtune.errors import InputError
from qtune.profile import Profile
from tests.fakes.profile import sample_profile

ROOT = Path(__file__).parents[2]
EXAMPLE_GPU = ROOT / "examples" / "h200x2-qwen3-4b" / "h200-qwen3-4b.yaml"

# The fields of monitoring.coreos.com/v1 ServiceMonitor that qtune writes,
# as the Prometheus Operator's CRD (v0.84.1) types them, unknown fields
# refused at every level qtune writes (written here from the API reference;
# the CRD itself is not vendored).
_INTERVAL = (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
             r"(([0-9]+)s)?(([0-9]+)ms)?)$")
SERVICE_MONITOR = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                     "maxLength": 253},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["selector"], "properties": {
                     "selector": {"type": "object", "additionalProperties": False,
                                  "properties": {"matchLabels": {
                                      "type": "object",
                                      "additionalProperties": {"type": "string"}}}},
                     "endpoints": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False,
                         "properties": {"port": {"type": "string"},
                                        "path": {"type": "string"},
                                        "interval": {"type": "string",
                                                     "pattern": _INTERVAL}}}}}},
    },
}


def service_monitor_validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft7Validator(SERVICE_MONITOR)


def _docs(text: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(text))


def _capacity(**over: Any) -> Profile:
    return sample_profile(
        metrics={"objective": {"name": "capacity", "direction": "maximize", "best": 22.0,
                               "baseline": 15.0}, "startup_s": 247.0},
        model={"id": "tiny", "path": "/m", "served_name": "tiny"}, **over)


def test_gpu_manifest_requests_what_it_measured_and_runs_unprivileged():
    prof = Profile.load(EXAMPLE_GPU)  # data_parallel_size 2 on a 2 x H200 host
    dep, _, _ = _docs(emit(prof, "kubernetes"))
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    res = c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "2"
    # 2 GiB of /dev/shm per GPU (a memory emptyDir: it counts against the pod)
    # + 4 GiB per GPU; 2 + 2 CPUs (API server, engine core, a worker per GPU)
    assert res["requests"]["memory"] == "12Gi" and res["requests"]["cpu"] == "4"
    # limits: the share of the tuning host the 2 of its 2 GPUs had
    host_gib = prof.host["memory_gib"]
    assert res["limits"]["memory"] == f"{int(host_gib)}Gi"
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    # everything the engine writes is an emptyDir: /tmp, the home, its caches
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert {"/tmp", "/home/qtune", "/dev/shm", "/home/qtune/.cache/vllm"} <= writable
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOME"] == "/home/qtune" and env["USER"] == "qtune"
    assert not any(a.startswith("/root") for a in c["args"])
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000",
                   "prometheus.io/path": "/metrics"}
    # one replica: its GPUs are not held twice by a rollout
    assert dep["spec"]["strategy"] == {"type": "Recreate"}


def test_cpu_manifest_requests_its_kv_cache_and_cpus():
    prof = sample_profile(placement={"numa_node": 0, "cpus": "0-3", "why": "test"},
                          host={"id": "abc", "memory_gib": 64.0, "logical_cpus": 8})
    dep, _, _ = _docs(emit(prof, "kubernetes"))
    res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    # VLLM_CPU_KVCACHE_SPACE=2 + 1.5 GiB runtime + 2 GiB shm = 5.5 -> 6 GiB;
    # the 4 CPUs it was placed on, of 8: half the host is the limit
    assert res["requests"] == {"cpu": "4", "memory": "6Gi"}
    assert res["limits"] == {"cpu": "4", "memory": "32Gi"}
    assert "nvidia.com/gpu" not in res["requests"]


def test_an_autoscaled_deployment_rolls_and_is_scraped():
    text = emit(_capacity(), "kubernetes", autoscale="keda")
    dep, svc, _, _, mon = _docs(text)
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    service_monitor_validator().validate(mon)
    assert mon["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert mon["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert "ServiceMonitor: the Prometheus Operator scrapes" in text


def test_the_service_monitor_schema_refuses_an_unknown_field():
    (*_, mon) = _docs(emit(_capacity(), "kubernetes", autoscale="hpa"))
    mon["spec"]["endpoints"][0]["scrapeEvery"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="scrapeEvery"):
        service_monitor_validator().validate(mon)


def test_every_manifest_passes_the_api_schema():
    kv = pytest.importorskip("kubernetes_validate",
                             reason="the test extra installs kubernetes-validate")
    for prof, scale in ((Profile.load(EXAMPLE_GPU), None), (_capacity(), "hpa")):
        for doc in _docs(emit(prof, "kubernetes", autoscale=scale)):
            if doc["kind"] == "ServiceMonitor":
                service_monitor_validator().validate(doc)
            else:
                kv.validate(doc, kv.latest_version(), strict=True)


@pytest.mark.parametrize("startup", [1e300, 86400.0 * 10])
def test_a_huge_start_time_is_refused_at_load(startup, tmp_path):
    """Issue 28: startup_s 1e300 gave a 301-digit TimeoutStartSec."""
    from qtune.errors import ProfileError

    data = sample_profile().model_dump(mode="json")
    data["metrics"]["startup_s"] = startup
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="metrics.startup_s"):
        Profile.load(path)


# -- mounts: only what a model folder can be (issue 28) -------------------------
BAD_MOUNTS = ["/", "//", "/var/run/docker.sock", "/run/docker.sock", "/run/containerd",
              "/etc", "/etc/ssl", "/proc", "/proc/1/root", "/sys", "/dev", "/dev/sda",
              "/root", "/home", "/home/alice", "/home/alice/", "/data/../etc",
              "/var/lib/kubelet/pods", "/srv/x/docker.sock", "/boot"]


@pytest.mark.parametrize("fmt", ["compose", "kubernetes"])
@pytest.mark.parametrize("path", BAD_MOUNTS)
def test_a_mount_that_is_no_model_folder_is_refused(fmt, path):
    base = sample_profile().argv[:3]
    for argv in ([*base, "--model", path], [*base, "--tokenizer=" + path],
                 # after a `--` too: the container formats mount what follows it
                 [*base, "--model", "/srv/m", "--", "--tokenizer", path]):
        with pytest.raises(InputError, match="no model folder") as e:
            emit(sample_profile(argv=argv), fmt)
        assert "config.json" in (e.value.hint or "")


@pytest.mark.parametrize("path", ["/srv/models/qwen", "/root/.cache/huggingface/hub/"
                                  "models--Qwen--Qwen3-4B/snapshots/abc",
                                  "/home/alice/models/qwen", "/data/m"])
def test_model_folders_are_mounted(path):
    p = sample_profile(argv=[*sample_profile().argv[:3], "--model", path])
    (svc,) = yaml.safe_load(emit(p, "compose"))["services"].values()
    assert any(v.get("type") == "bind" for v in svc["volumes"])


# -- the policy checker operators run -------------------------------------------
def _checkov() -> str | None:
    local = ROOT / ".venv-checkov" / "bin" / "checkov"  # scripts/test.sh installs it
    return (os.environ.get("QTUNE_CHECKOV") or (str(local) if local.is_file() else None)
            or shutil.which("checkov"))


# Checkov checks the manifests fail on purpose, each for a reason a
# deploy of a tuned server keeps:
ACCEPTED = {
    # the image is the engine's release at the version the profile was tuned
    # on, by tag (vllm/vllm-openai:v0.26.0): a digest would be this host's
    # guess at a registry it does not ask
    "CKV_K8S_43": "image by tag, not digest",
    # pulled when absent: a GPU image is 10+ GB, and air-gapped GPU clusters
    # cannot pull Always; the tag pins the version
    "CKV_K8S_15": "imagePullPolicy not Always",
    # no namespace: `kubectl apply -n NS` places it where the operator wants
    "CKV_K8S_21": "default namespace",
}


@pytest.mark.parametrize("scale", [None, "hpa", "keda"])
def test_checkov_finds_nothing_but_the_accepted(scale, tmp_path):
    tool = _checkov()
    if tool is None:
        pytest.skip("checkov not installed (scripts/test.sh installs it in .venv-checkov)")
    prof = Profile.load(EXAMPLE_GPU) if scale is None else _capacity()
    f = tmp_path / "kubernetes.yaml"
    f.write_text(emit(prof, "kubernetes", autoscale=scale))
    r = subprocess.run([tool, "-f", str(f), "--framework", "kubernetes", "-o", "json",
                        "--quiet", "--skip-download"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, env={**os.environ, "BC_SKIP_MAPPING": "TRUE",
                                                        "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": ""})
    assert r.returncode in (0, 1), r.stderr[-2000:]
    out = json.loads(r.stdout)
    failed = out.get("results", {}).get("failed_checks", []) if isinstance(out, dict) else []
    unexpected = sorted({(c["check_id"], c["check_name"]) for c in failed
                         if c["check_id"] not in ACCEPTED})
    assert not unexpected, unexpected


@pytest.mark.parametrize("cpus", ["\u0660-\u0663", "0-\u0663", "\uff10-3"])
def test_unicode_digits_are_no_cpu_list(cpus):
    """Issue 28: ``placement.cpus`` in Arabic-Indic or full-width digits was
    accepted (int() reads them) and systemd failed to parse CPUAffinity=."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="CPU list"):
        sample_profile(placement={"numa_node": 0, "cpus": cpus, "why": "x"})


@pytest.mark.parametrize("metrics", [
    {"objective": {"name": "capacity", "direction": "maximize", "best": 1e300}},
    {"objective": {"name": "e2e_p99", "direction": "minimize", "best": 1.0},
     "best": {"request_throughput": float("inf")}},
])
def test_no_autoscaler_on_a_figure_that_is_no_measurement(metrics):
    """Issue 28: ``inf`` gave ``threshold: inf`` in KEDA (and 1e300 one no
    load reaches): a profile holding such a figure is refused when it is
    read (every number finite and within +-1e15), so no emitter sees it."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite number"):
        sample_profile(metrics=metrics)


# -- through `qtune emit`, as the console script runs it --------------------------
def _argv_plus(*words: str) -> Any:
    def change(d: dict[str, Any]) -> None:
        d["argv"] = [*d["argv"], *words]
    return change


def _python_at(path: str) -> Any:
    def change(d: dict[str, Any]) -> None:
        d["argv"][0] = path
    return change


def _param(name: str, value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        d["params"][name] = value
    return change


@pytest.mark.parametrize(("fmt", "change", "needle"), [
    ("compose", _argv_plus("--tokenizer", "/"), "--tokenizer /: a container would mount"),
    ("kubernetes", _argv_plus("--", "--tokenizer", "/var/run/docker.sock"),
     "/var/run/docker.sock"),
    ("kubernetes", _argv_plus("--tokenizer=/home/alice"), "no model folder"),
    ("systemd", _python_at("/tmp/clone/.venv/bin/python3"),
     "ExecStart: /tmp/clone/.venv/bin/python3 is under /tmp"),
    ("systemd", _argv_plus("--tokenizer", "/root/.cache/qtune/t"), "only root can read"),
    ("systemd", _param("max_num_seqs", 64),
     "params.max_num_seqs is 64 but argv has --max-num-seqs 8"),
    ("kubernetes", _param("max_num_seqs", "fast"), "params.max_num_seqs is fast"),
])
def test_refused_through_the_cli_with_one_error_and_a_hint(
        tmp_path, monkeypatch, capsys, fmt, change, needle):
    from tests.emit.test_hostile import run_emit, write_profile

    path = write_profile(tmp_path, change)
    rc, out, err = run_emit([str(path), "--format", fmt, "-o", str(tmp_path / "f")],
                            monkeypatch, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and "Traceback" not in out + err, err
    assert len(lines) == 2 and lines[0].startswith("error: ") and needle in lines[0], err
    assert lines[1].startswith("hint: "), err
    assert sorted(os.listdir(tmp_path)) == ["p.yaml"]  # nothing written
