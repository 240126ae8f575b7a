"""Deploy files for every engine in the registry, through the same checks the
vLLM ones pass: the systemd unit read back and ``systemd-analyze verify``,
the Kubernetes manifests against the API schema, the Compose file through
``docker-compose config``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from qtune.emit import emit
from qtune.engines import ENGINES
from qtune.engines import probe_host as probe
from qtune.engines.base import SpaceContext
from qtune.errors import InputError
from qtune.host.installed import EngineInstall
from qtune.model import resolve_model
from qtune.profile import Profile
from tests.emit import readback as rb
from tests.emit.test_properties import check_systemd
from tests.engines.conftest import H200X2, replay_nvml
from tests.fakes.model import make_model
from tests.fakes.profile import PYTHON, sample_profile

VERSIONS = {"vllm": "0.26.0", "sglang": "0.5.17", "tgi": "3.3.7", "transformers": "5.19.0"}


def image_of(name: str) -> str | None:
    """None for an engine with a published image (the emitter picks it),
    else one named as a user would (--image): transformers publishes none."""
    return None if ENGINES[name].image("cuda", VERSIONS[name]) else f"me/{name}:1"


def engine_profile(name: str, tmp_path: Path) -> Profile:
    """The profile a study on 2xH200 would write for ``name``: its own
    launch command for a config of its space, with its engine's name."""
    engine = ENGINES[name]
    program = tmp_path / "bin" / "text-generation-launcher"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    host = probe(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable)
    model = resolve_model(str(make_model(tmp_path / "qwen3-4b")))
    install = EngineInstall(name, VERSIONS[name], "cuda", PYTHON, str(program))
    ctx = SpaceContext(host, model, install)
    params = {p.name: (p.choices[-1] if p.kind == "choice" else p.low)
              for p in engine.space(ctx) if p.kind != "bool"}
    params.update({k: 2 for k in ("tensor_parallel_size", "tp_size", "num_shard")
                   if k in params})
    params.pop("data_parallel_size", None)
    params.pop("dp_size", None)
    spec = engine.launch_spec(params, ctx, host="127.0.0.1", port=8000)
    return sample_profile(
        name=f"{name}-h200", engine={"name": name, "version": VERSIONS[name], "build": "cuda"},
        params=params, env=dict(spec.env), argv=list(spec.argv),
        model={"id": "qwen3-4b", "path": str(model.path)})


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_the_unit_reads_back_and_systemd_accepts_it(name, tmp_path, monkeypatch):
    # The model, tokenizer and program in a folder the unit's DynamicUser= can
    # reach (tmp_path lies under /tmp/pytest-of-root, mode 0700, which the
    # emitter refuses); under /var/tmp, which PrivateTmp= would hide: opted out
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="qtune-test-"))
    try:
        base.chmod(0o755)
        monkeypatch.setenv("QTUNE_CACHE", str(base / "cache"))  # the generated tokenizer
        p = engine_profile(name, base)
        text = emit(p, "systemd", allow_tmp=True)
        check_systemd(p, text, allow_tmp=True)
        if shutil.which("systemd-analyze") is None:
            pytest.skip("systemd-analyze not installed (.ci/run installs it)")
        rb.assert_systemd_verifies(tmp_path / "qtune-test.service", text)
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_the_container_runs_the_tuned_command_in_the_engine_s_image(name, tmp_path):
    p = engine_profile(name, tmp_path)
    engine = ENGINES[name]
    words = engine.command_words()
    (svc,) = yaml.safe_load(emit(p, "compose", image=image_of(name)))["services"].values()
    if image_of(name) is None:
        assert svc["image"] == engine.image("cuda", VERSIONS[name])
        assert VERSIONS[name] in svc["image"]  # pinned to the tuned version
    split = words.split(p.argv)
    assert split is not None
    assert svc["entrypoint"] == split[0]
    args = svc["command"]
    assert args[args.index(words.host) + 1] == "0.0.0.0"
    assert args[args.index(words.model[0]) + 1].startswith("/models/")
    # every host folder the command names is mounted where it now points
    mounted = {v["target"] for v in svc["volumes"] if v["type"] == "bind"}
    folders = [args[i + 1] for i, a in enumerate(args) if a in words.model + words.tokenizer]
    assert folders and set(folders) == mounted
    gpus = svc["deploy"]["resources"]["reservations"]["devices"][0]["count"]
    assert gpus == engine.gpus_used(p.params) == (2 if set(p.params) & {
        "tensor_parallel_size", "tp_size", "num_shard"} else 1)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_kubernetes_manifests_pass_the_api_schema(name, tmp_path):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="the test extra installs kubernetes-validate")
    for doc in yaml.safe_load_all(emit(engine_profile(name, tmp_path), "kubernetes",
                                       image=image_of(name))):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose not installed (scripts/test.sh installs it)")
@pytest.mark.parametrize("name", sorted(ENGINES))
def test_compose_file_passes_docker_compose_config(name, tmp_path):
    f = tmp_path / "compose.yaml"
    f.write_text(emit(engine_profile(name, tmp_path), "compose", image=image_of(name)))
    r = subprocess.run(["docker-compose", "-f", str(f), "config", "-q"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "variable is not set" not in r.stderr, r.stderr


# The profiles the H200 studies wrote (the worked examples): the engine, the
# device's Python in ExecStart, flags the unit must carry, and the image.
H200_EXAMPLES = [
    # run 10: `qtune search --engine sglang`
    ("h200-sglang-qwen3-4b", "h200-sglang-qwen3-4b.yaml", "sglang", "/opt/torch/.venv/bin/python3",
     ("--quantization fp8", "--max-running-requests 53"), "lmsysorg/sglang:v0.5.17-cu130-runtime"),
    # run 11: `qtune search --engine vllm,sglang --objective capacity`: vLLM's defaults won
    ("h200-vllm-vs-sglang", "h200-engines.yaml", "vllm", "/tmp/venv-vllm/bin/python",
     ("-m vllm.entrypoints.openai.api_server", "--load-format dummy"), "vllm/vllm-openai:v0.26.0"),
]


@pytest.mark.parametrize("folder,name,engine,python,flags,image", H200_EXAMPLES,
                         ids=[e[0] for e in H200_EXAMPLES])
def test_the_h200_studies_profiles_emit_files_the_validators_accept(
        tmp_path, folder, name, engine, python, flags, image):
    """The profiles `qtune search` wrote on the H200 (runs 10 and 11 of
    benchmarks/gpu-h200/RESULTS.md; the worked examples) emit a unit systemd
    accepts, a Compose file docker-compose accepts and manifests the
    Kubernetes schema accepts.  Their Python is the device's, absent here:
    systemd checks that ExecStart exists, so this host's Python stands in."""
    real = Profile.load(Path(__file__).parents[2] / "examples" / folder / name)
    assert real.engine.name == engine and real.argv[0] == python
    p = real.model_copy(update={"argv": [PYTHON, *real.argv[1:]]})
    # the model under /tmp and the tokenizer under /root, as on the device:
    # refused as they are, emitted for root with /tmp visible
    with pytest.raises(InputError, match="/tmp/qrepo/examples/qwen3-4b"):
        emit(p, "systemd")
    unit = emit(p, "systemd", user="root", allow_tmp=True)
    check_systemd(p, unit, user="root", allow_tmp=True)
    assert all(f in unit for f in flags), unit
    for kind, text in (("kubernetes", emit(p, "kubernetes")), ("compose", emit(p, "compose"))):
        assert image in text, kind
    if shutil.which("systemd-analyze"):
        rb.assert_systemd_verifies(tmp_path / f"qtune-{folder}.service", unit)
    if shutil.which("docker-compose"):
        f = tmp_path / "compose.yaml"
        f.write_text(emit(p, "compose"))
        r = subprocess.run(["docker-compose", "-f", str(f), "config", "-q"],
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0 and "variable is not set" not in r.stderr, r.stderr
    kv = pytest.importorskip("kubernetes_validate")
    for doc in yaml.safe_load_all(emit(p, "kubernetes")):
        kv.validate(doc, kv.latest_version(), strict=True)
