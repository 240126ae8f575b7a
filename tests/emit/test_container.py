from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from qtune.emit import emit
from qtune.emit.container import container_view
from qtune.errors import InputError
from qtune.profile import Profile
from tests.fakes.profile import sample_profile

EXAMPLE_GPU = Path(__file__).parents[2] / "examples" / "h200x2-qwen3-4b" / "h200-qwen3-4b.yaml"
# HF_HUB_CACHE=/data/hf: a snapshot with no "hub" folder above it.
HF_SNAPSHOT = "/data/hf/models--Qwen--Qwen3-4B/snapshots/abc123"


def awkward_profile(**over) -> Profile:
    """A GPU profile with a Hub-cache model, a separate tokenizer folder, a
    host-only PYTHONPATH, a `$` and a `%` in argv, and a NUMA placement."""
    base = sample_profile()
    argv = base.argv[:3] + ["--model", HF_SNAPSHOT, "--tokenizer", "/opt/tok",
                            "--host", "127.0.0.1", "--port", "8123",
                            "--tensor-parallel-size", "2", "-cc", '{"x": "50%"}', "--y", "$z"]
    data = base.model_dump() | {
        "engine": {"name": "vllm", "version": "0.26.0", "build": "cuda"},
        "params": {"tensor_parallel_size": 2, "data_parallel_size": 2},
        "env": {"HF_HUB_OFFLINE": "1", "PYTHONPATH": "/host/site", "A": "$B"},
        "argv": argv,
        "placement": {"numa_node": 1, "cpus": "16-31", "why": "GPUs on node 1"},
    } | over
    return Profile.model_validate(data)


def test_view_maps_host_paths_ports_gpus_and_env():
    c = container_view(awkward_profile())
    assert c.image == "vllm/vllm-openai:v0.26.0"
    assert c.command == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    # A Hub snapshot is symlinks into its repo's blobs/: the repo folder is
    # mounted (not the whole cache, which holds the token file).
    hf = next(m for m in c.mounts if m.name == "hf-qwen--qwen3-4b")
    assert hf.host == "/data/hf/models--Qwen--Qwen3-4B"
    assert c.args[c.args.index("--model") + 1] == (
        "/root/.cache/huggingface/hub/models--Qwen--Qwen3-4B/snapshots/abc123")
    # Kubernetes runs it as a non-root user, whose home is not /root
    home = container_view(awkward_profile(), home="/home/qtune")
    assert home.args[home.args.index("--model") + 1] == (
        "/home/qtune/.cache/huggingface/hub/models--Qwen--Qwen3-4B/snapshots/abc123")
    assert c.args[c.args.index("--tokenizer") + 1] == "/models/tokenizer-tok"
    assert c.args[c.args.index("--host") + 1] == "0.0.0.0"
    assert c.port == 8123 and c.gpus == 4 and c.cpus == "16-31"
    assert "PYTHONPATH" not in c.env and c.env["A"] == "$B"
    cpu = container_view(sample_profile())
    assert cpu.gpus == 0 and cpu.image.endswith("vllm-cpu-release-repo:v0.32.0")
    assert container_view(sample_profile(), image="my/vllm:1").image == "my/vllm:1"


def test_compose_escapes_dollars_and_reserves_gpus():
    doc = yaml.safe_load(emit(awkward_profile(), "compose"))
    (name, svc), = doc["services"].items()
    assert name == "tiny-test"
    assert svc["command"][-1] == "$$z" and svc["environment"]["A"] == "$$B"
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 4, "capabilities": ["gpu"]}]
    assert svc["cpuset"] == "16-31" and svc["ports"] == ["127.0.0.1:8123:8123"]
    assert {"type": "bind", "source": "/data/hf/models--Qwen--Qwen3-4B",
            "target": "/home/qtune/.cache/huggingface/hub/models--Qwen--Qwen3-4B",
            "read_only": True} in svc["volumes"]
    assert svc["environment"]["HF_TOKEN"] is None  # passed through, never written
    assert svc["healthcheck"]["start_period"] == "600s"


def test_kubernetes_sizes_probes_from_the_tuned_start_and_reads_the_token_from_a_secret():
    dep, svc, _ = yaml.safe_load_all(emit(awkward_profile(
        metrics={**sample_profile().metrics, "startup_s": 300.0}), "kubernetes"))
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" == \
        c["resources"]["requests"]["nvidia.com/gpu"]
    # 4 x 300 s = 1200 s of start allowance, probed every 10 s.
    assert c["startupProbe"]["failureThreshold"] == 120
    # the token is a file from an optional Secret, never an env value
    assert {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/huggingface/token"} in c["env"]
    assert {"name": "hf-token", "secret": {"secretName": "hf-token", "optional": True,
                                           "defaultMode": 0o440}} in pod["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    assert svc["spec"]["ports"][0]["port"] == 8123
    assert dep["spec"]["strategy"] == {"type": "Recreate"}


def test_paths_that_would_collide_or_break_get_their_own_mounts():
    base = sample_profile()
    c = container_view(sample_profile(argv=base.argv[:3] + [
        "--model=/a/tokenizer-foo", "--tokenizer", "/b/foo", "--host=127.0.0.1",
        "--port=9000"]))
    targets = [m.container for m in c.mounts]
    assert len(set(targets)) == 2 and len({m.name for m in c.mounts}) == 2
    assert c.args[c.args.index("--tokenizer") + 1] in targets
    assert c.args[c.args.index("--host") + 1] == "0.0.0.0" and c.port == 9000
    with pytest.raises(InputError, match="relative path"):
        container_view(sample_profile(argv=base.argv[:3] + ["--model", "models/m"]))


def test_names_suit_kubernetes():
    from qtune.emit.container import dns_name

    assert dns_name("2xh200-run") == "q-2xh200-run"  # a Service starts with a letter
    long_a = "qwen-qwen3-30b-a3b-instruct-2507-fp8-h200x8-i1024-o256-r40-e2e_p99"
    long_b = long_a.replace("r40", "r20")
    assert len(dns_name(long_a)) <= 63 and dns_name(long_a) != dns_name(long_b)


def test_kubernetes_does_not_expand_variables_in_args():
    p = sample_profile(argv=sample_profile().argv + ["--x", "$(HOME)"],
                       env={"A": "$(B)"})
    (c,) = next(yaml.safe_load_all(emit(p, "kubernetes")))["spec"]["template"]["spec"][
        "containers"]
    assert c["args"][-1] == "$$(HOME)"
    assert {"name": "A", "value": "$$(B)"} in c["env"]


def test_no_secret_or_host_install_reaches_a_container_file():
    for fmt in ("compose", "kubernetes"):
        text = emit(awkward_profile(), fmt)
        assert "/host/site" not in text and "&id" not in text


@pytest.mark.parametrize(("fmt", "kwargs", "needle"), [
    ("docker", {}, "compose, grafana, host, kubernetes, prometheus-rules, systemd"),
    ("systemd", {"image": "x/y:1"}, "compose and kubernetes"),
])
def test_bad_format_or_option(fmt, kwargs, needle):
    with pytest.raises(InputError) as e:
        emit(sample_profile(), fmt, **kwargs)
    assert needle in (e.value.hint or "")


def test_a_command_that_is_not_a_module_is_refused_with_a_hint():
    p = sample_profile(argv=["/usr/bin/text-generation-launcher", "--model-id", "x"])
    with pytest.raises(InputError, match="python -m") as e:
        emit(p, "kubernetes")
    assert "systemd" in e.value.hint
    # an engine qtune has no adapter for (TGI has one now)
    p = sample_profile(engine={"name": "tensorrt-llm", "version": "3", "build": "cuda"})
    with pytest.raises(InputError, match="no published image") as e:
        emit(p, "compose")
    assert "--image" in e.value.hint


@pytest.mark.parametrize("path", [EXAMPLE_GPU, awkward_profile])
def test_kubernetes_manifests_pass_the_api_schema(path):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="the test extra installs kubernetes-validate")
    profile = path() if callable(path) else Profile.load(path)
    for doc in yaml.safe_load_all(emit(profile, "kubernetes")):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def odd_paths_profile() -> Profile:
    """Host folders with ':' and '$' in their names (a short-form volume
    would break on the first, interpolation on the second)."""
    base = sample_profile()
    return sample_profile(argv=base.argv[:3] + ["--model", "/data/qwen:v2",
                                                 "--tokenizer", "/data/my$tok"])


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose not installed (scripts/test.sh installs it)")
@pytest.mark.parametrize("path", [EXAMPLE_GPU, awkward_profile, odd_paths_profile])
def test_compose_file_passes_docker_compose_config(path, tmp_path):
    profile = path() if callable(path) else Profile.load(path)
    f = tmp_path / "compose.yaml"
    f.write_text(emit(profile, "compose"))
    r = subprocess.run(["docker-compose", "-f", str(f), "config", "-q"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "variable is not set" not in r.stderr, r.stderr


EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*/*.yaml")
                  if p.name not in ("compose.yaml", "kubernetes.yaml"))


@pytest.mark.parametrize("path", [*EXAMPLES, awkward_profile, sample_profile])
def test_compose_is_hardened_and_sized_as_the_kubernetes_manifest(path, tmp_path):
    """Deployable as is (issue 29): the Kubernetes manifest's user, privileges
    and read-only root, the same memory and CPU figures, its shared memory;
    and the file still passes `docker-compose config`."""
    profile = path() if callable(path) else Profile.load(path)
    text = emit(profile, "compose")
    (svc,) = yaml.safe_load(text)["services"].values()
    (dep, *_) = yaml.safe_load_all(emit(profile, "kubernetes"))
    pod = dep["spec"]["template"]["spec"]
    (k8s,) = pod["containers"]
    ctx = k8s["securityContext"]
    assert svc["user"] == f"{ctx['runAsUser']}:{ctx['runAsGroup']}" == "10001:10001"
    assert ctx["readOnlyRootFilesystem"] and svc["read_only"] is True
    assert not ctx["allowPrivilegeEscalation"]
    assert svc["security_opt"] == ["no-new-privileges:true"]
    assert ctx["capabilities"]["drop"] == svc["cap_drop"] == ["ALL"]
    # every path the engine writes is a tmpfs the user owns (or /tmp)
    assert svc["tmpfs"] == ["/tmp:mode=1777", "/home/qtune:uid=10001,gid=10001,mode=0700"]
    env = svc["environment"]
    assert env["HOME"] == "/home/qtune" and env["HF_HOME"].startswith("/home/qtune/")
    assert env["XDG_CACHE_HOME"].startswith("/home/qtune/")
    assert "ipc" not in svc and "privileged" not in text and "volumes" not in yaml.safe_load(
        text)  # no root-owned named volume the user could not write
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert svc["shm_size"] == dshm["emptyDir"]["sizeLimit"].replace("Gi", "gb")
    res = svc["deploy"]["resources"]
    assert res["reservations"]["memory"] == k8s["resources"]["requests"]["memory"].replace(
        "Gi", "gb")
    assert res["limits"]["memory"] == k8s["resources"]["limits"]["memory"].replace("Gi", "gb")
    assert res["reservations"]["cpus"] == k8s["resources"]["requests"]["cpu"]
    assert res["limits"]["cpus"] == k8s["resources"]["limits"]["cpu"]
    gpus = k8s["resources"]["limits"].get("nvidia.com/gpu")
    assert res["reservations"].get("devices") == (
        [{"driver": "nvidia", "count": int(gpus), "capabilities": ["gpu"]}] if gpus else None)
    port = int(svc["ports"][0].rsplit(":", 1)[1])
    assert f"http://localhost:{port}/health" in svc["healthcheck"]["test"][-1]
    assert svc["restart"] == "unless-stopped"
    assert svc["stop_grace_period"] == f"{pod['terminationGracePeriodSeconds'] // 60}m"
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed (scripts/test.sh installs it)")
    f = tmp_path / "compose.yaml"
    f.write_text(text)
    r = subprocess.run(["docker-compose", "-f", str(f), "config"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (out,) = yaml.safe_load(r.stdout)["services"].values()
    # what Compose itself reads back: nothing dropped or reinterpreted
    for key in ("user", "read_only", "tmpfs", "security_opt", "cap_drop", "restart"):
        assert out[key] == svc[key], key
    assert out["deploy"]["resources"]["limits"]["memory"] == res["limits"]["memory"]


@pytest.mark.parametrize("fmt", ["compose", "kubernetes"])
def test_container_formats_say_nothing_about_this_host(fmt):
    """A container does not run on the host that emits it: no "this host
    differs" warnings (issue 29: four of them, about the wrong machine)."""
    import json
    import sys

    r = subprocess.run([sys.executable, "-m", "qtune", "emit", str(EXAMPLE_GPU), "-f", fmt,
                        "--json"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parents[2])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    assert "this host differs" not in r.stderr
