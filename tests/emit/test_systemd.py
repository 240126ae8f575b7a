from __future__ import annotations

import shutil

import pytest

from qtune.emit import emit
from qtune.emit.systemd import env_assignment, exec_word, render
from qtune.errors import InputError
from tests.emit import readback as rb
from tests.fakes.profile import sample_profile


@pytest.mark.parametrize(
    ("word", "out"),
    [
        ("--max-num-seqs", "--max-num-seqs"),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ("a b", '"a b"'),
        ('{"mode": 3}', '"{\\"mode\\": 3}"'),
        ("back\\slash", '"back\\\\slash"'),
        (";", "\\;"),
        ("", '""'),
    ],
)
def test_exec_word(word, out):
    assert exec_word(word) == out


def test_env_assignment():
    assert env_assignment("A", "1") == "A=1"
    assert env_assignment("A", "x y") == '"A=x y"'
    assert env_assignment("A", "50%") == "A=50%%"
    assert env_assignment("A", "$x") == "A=$x"  # no $ expansion in Environment=


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b"])
def test_control_characters_rejected(bad):
    with pytest.raises(InputError):
        exec_word(bad)
    with pytest.raises(InputError):
        env_assignment("A", bad)


def test_unit_content():
    text = render(sample_profile())
    assert "Restart=on-failure" in text
    assert "EnvironmentFile=-/etc/qtune/qtune-tiny-test.env" in text
    assert "Environment=VLLM_CPU_KVCACHE_SPACE=2" in text
    assert "TimeoutStartSec=600" in text
    assert "DeviceAllow" not in text  # CPU build: no GPU devices
    gpu = render(sample_profile(engine={"name": "vllm", "version": "0.26.0",
                                        "build": "cuda"}))
    assert "DeviceAllow=char-nvidia* rw" in gpu and "PrivateDevices" not in gpu
    assert "NUMAPolicy" not in text  # no placement recorded


def test_unit_places_the_server_on_the_gpus_numa_node():
    placed = render(sample_profile(placement={
        "numa_node": 1, "cpus": "16-31,48-63", "why": "GPU 0 is attached to NUMA node 1"}))
    assert "CPUAffinity=16-31,48-63\nNUMAPolicy=bind\nNUMAMask=1\n" in placed
    assert "# NUMA: GPU 0 is attached to NUMA node 1" in placed
    single = render(sample_profile(placement={
        "numa_node": None, "cpus": None, "why": "one NUMA node: no placement needed"}))
    assert "NUMAMask" not in single and "# NUMA: one NUMA node" in single


def test_unknown_format():
    with pytest.raises(InputError, match="docker"):
        emit(sample_profile(), "docker")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (.ci/run installs it)")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # Awkward argv on purpose: %, $, spaces, quotes, JSON.
    p = sample_profile(argv=sample_profile().argv + [
        "--served-model-name", "a b", "-cc", '{"mode": 3, "x": "50%"}', "--x", "$y"],
        placement={"numa_node": 0, "cpus": "0-1", "why": "test"})
    rb.assert_systemd_verifies(tmp_path / "qtune-test.service", render(p))


EXAMPLES = sorted(p.with_suffix(".yaml") for p in (
    __import__("pathlib").Path(__file__).parents[2] / "examples").glob("*/*.service"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_worked_examples_still_load_and_emit_their_committed_files(path):
    """The GPU worked examples are profiles written on the device: they must
    keep loading under the current schema and emit the unit (and Compose file
    and manifests, where committed) next to them: a change to either shows
    here, not in a user's deploy."""
    from qtune.profile import Profile

    profile = Profile.load(path)
    # Tuned with the model under /tmp and the tokenizer under /root: a unit
    # as it is would not find them; the committed one is root's, /tmp visible.
    with pytest.raises(InputError, match="/tmp/"):
        emit(profile, "systemd")
    unit = emit(profile, "systemd", user="root", allow_tmp=True)
    assert unit == path.with_suffix(".service").read_text()
    for fmt, name in (("compose", "docker-compose.yml"), ("kubernetes", "kubernetes.yml")):
        if (path.parent / name).is_file():
            assert emit(profile, fmt) == (path.parent / name).read_text()


# -- a unit that finds its files and runs unprivileged (issue 29) ---------------
@pytest.mark.parametrize(("change", "path"), [
    ({"argv": ["/tmp/clone/.venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]},
     "/tmp/clone/.venv/bin/python3"),
    ({"argv": [*sample_profile().argv[:3], "--model", "/tmp/qrepo/m"]}, "/tmp/qrepo/m"),
    ({"argv": [*sample_profile().argv[:3], "--model=/var/tmp/m"]}, "/var/tmp/m"),
    ({"env": {"PYTHONPATH": "/opt/site:/tmp/site"}}, "/tmp/site"),
])
def test_a_path_private_tmp_hides_is_refused_unless_allowed(change, path):
    p = sample_profile(**change)
    with pytest.raises(InputError, match="PrivateTmp") as e:
        render(p)
    assert path in e.value.message and "--allow-tmp" in (e.value.hint or "")
    unit = render(p, allow_tmp=True)
    assert "PrivateTmp" not in unit and path in unit


def test_a_path_under_root_needs_root():
    p = sample_profile(argv=[*sample_profile().argv[:3], "--tokenizer",
                             "/root/.cache/qtune/tokenizers/t"])
    with pytest.raises(InputError, match="only root can read") as e:
        render(p)
    assert "--user root" in (e.value.hint or "")
    with pytest.raises(InputError, match="/root"):
        render(p, user="alice")
    assert "User=root" in render(p, user="root")


def test_the_unit_runs_unprivileged_with_its_own_cache_and_the_gpus():
    cpu = render(sample_profile())
    assert "DynamicUser=yes" in cpu and "User=" not in cpu.replace("DynamicUser", "")
    name = "qtune-tiny-test"
    assert f"CacheDirectory={name}" in cpu and f"StateDirectory={name}" in cpu
    assert f"Environment=HF_HOME=/var/cache/{name}/huggingface" in cpu
    assert f"Environment=HOME=/var/lib/{name}" in cpu
    assert "SupplementaryGroups" not in cpu  # no GPU
    gpu = render(sample_profile(engine={"name": "vllm", "version": "0.26.0",
                                        "build": "cuda"}), user="vllm")
    assert "User=vllm" in gpu and "DynamicUser" not in gpu
    assert "SupplementaryGroups=video render" in gpu
    assert "DevicePolicy=closed" in gpu and "DeviceAllow=/dev/nvidia-uvm rw" in gpu
    # the profile's own env wins over the cache folders
    own = render(sample_profile(env={"HF_HOME": "/srv/hf"}))
    assert "Environment=HF_HOME=/srv/hf" in own and "/var/cache/qtune-tiny-test/hug" not in own
    with pytest.raises(InputError, match="--user"):
        render(sample_profile(), user="root; rm -rf /")
    with pytest.raises(InputError, match="--user"):
        emit(sample_profile(), "compose", user="alice")
    with pytest.raises(InputError, match="unsafe"):  # systemd-analyze's own warning
        render(sample_profile(), user="nobody")


def test_the_unit_carries_the_profiles_warnings():
    p = sample_profile(model={"id": "m", "path": "/m", "load_format": "dummy"},
                       notes=["tuned with random weights"],
                       metrics={**sample_profile().metrics, "quality": {
                           "measured": False, "numerics": {"kv_cache_dtype": "fp8"}}})
    head = render(p).split("[Unit]")[0]
    assert "# WARNING: this command loads RANDOM weights" in head
    assert "# WARNING: this config changes the model's numerics (kv_cache_dtype=fp8)" in head
    assert "# note: tuned with random weights" in head


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (.ci/run installs it)")
@pytest.mark.parametrize("user", [None, "root", "vllm"])
def test_systemd_analyze_accepts_the_sandboxed_gpu_unit(tmp_path, user):
    p = sample_profile(engine={"name": "vllm", "version": "0.26.0", "build": "cuda"},
                       model={"id": "m", "path": "/m", "load_format": "dummy"})
    rb.assert_systemd_verifies(tmp_path / "qtune-gpu.service", render(p, user=user))
