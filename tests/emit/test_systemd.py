from __future__ import annotations

import shutil
import subprocess

import pytest

from qtune.emit import emit
from qtune.emit.systemd import env_assignment, exec_word, render
from qtune.errors import InputError
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
    unit = tmp_path / "qtune-test.service"
    unit.write_text(render(p))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no",
                        str(unit)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "qtune-test.service" not in r.stderr, r.stderr


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
