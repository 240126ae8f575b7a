"""The CPU build's binding in deploy files: the systemd unit binds memory
and CPUs to match the profile's thread binding, and ``--format host`` gives
the host settings as a script; both checked by their real tools."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qtune.emit import emit
from qtune.emit.systemd import render
from qtune.engines.vllm_cpubind import bind_cpus
from qtune.errors import InputError
from qtune.host import placement, probe
from qtune.host.settings import SETTINGS
from tests.conftest import FIX
from tests.emit import readback as rb
from tests.emit.test_properties import _SPECIAL, check_systemd, load
from tests.fakes.nvml import NoNVML
from tests.fakes.profile import sample_profile

XEON = FIX / "hosts" / "xeon-2s-32c-smt"
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "40"}


def _xeon_profile(ranks: int, bind: str, **env: str):
    facts = probe(root=XEON, nvml=NoNVML())
    return sample_profile(placement=placement(facts, ranks),
                          params={"tensor_parallel_size": ranks},
                          env={**ENV, "VLLM_CPU_OMP_THREADS_BIND": bind, **env})


def test_one_rank_binds_the_unit_to_its_node():
    unit = render(_xeon_profile(1, "0-31,64-95",
                                LD_PRELOAD="/usr/lib64/libtcmalloc.so.4"))
    assert ("# threads: VLLM_CPU_OMP_THREADS_BIND=0-31,64-95: threads pinned to "
            "CPUs 0-31,64-95 (one list per rank)\nCPUAffinity=0-31,64-95\n"
            "NUMAPolicy=bind\nNUMAMask=0\n") in unit
    assert "Environment=LD_PRELOAD=/usr/lib64/libtcmalloc.so.4" in unit
    assert "vLLM pins one thread per core" in render(_xeon_profile(1, "auto"))
    assert "unpinned" in render(_xeon_profile(1, "nobind"))


def test_two_ranks_leave_the_nodes_to_vllm():
    unit = render(_xeon_profile(2, "0-31,64-95|32-63,96-127"))
    assert "NUMAMask" not in unit and "CPUAffinity" not in unit
    assert "# NUMA: 2 CPU ranks, one per NUMA node" in unit
    assert "pinned to CPUs 0-31,64-95|32-63,96-127" in unit


def test_a_binding_outside_the_units_cpus_is_refused():
    with pytest.raises(InputError, match="outside the unit's CPUAffinity"):
        render(_xeon_profile(1, "32-63"))
    with pytest.raises(InputError, match="neither auto, nobind nor CPU lists"):
        render(_xeon_profile(1, "all"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (.ci/run installs it)")
@pytest.mark.parametrize(("ranks", "bind"), [(1, "0-31,64-95"), (1, "auto"),
                                             (2, "0-31,64-95|32-63,96-127")])
def test_systemd_analyze_verify_accepts_the_bound_unit(tmp_path, ranks, bind):
    rb.assert_systemd_verifies(tmp_path / "qtune-cpu.service",
                               render(_xeon_profile(ranks, bind, LD_PRELOAD="/usr/lib/x.so")))


_lists = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), min_size=1,
                  max_size=3).map(lambda rs: ",".join(
                      f"{lo}-{lo + n}" if n else str(lo) for lo, n in rs))
binds = st.one_of(
    st.sampled_from(["auto", "nobind"]),
    st.lists(_lists, min_size=1, max_size=2).map("|".join),
    st.text(alphabet="0123456789-,|\n\r\\%$\" ab#[]=", max_size=14),
    st.sampled_from(_SPECIAL))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bind=binds, cpus=st.one_of(_lists, st.sampled_from(["0-3\n[Service]", "0 1"])),
       node=st.integers(0, 3))
def test_a_hostile_binding_cannot_add_a_line(tmp_path, bind, cpus, node):
    """Any thread binding and placement: refused at load, refused by the
    emitter (malformed, or outside CPUAffinity=), or a unit that reads back
    as exactly the profile's env with the binding lines and no other key."""
    data = sample_profile().model_dump(mode="json") | {
        "env": {**ENV, "VLLM_CPU_OMP_THREADS_BIND": bind},
        "placement": {"numa_node": node, "cpus": cpus, "why": "w"}}
    p = load(tmp_path, data)
    if p is None:
        return
    try:
        lists = bind_cpus(bind)
    except ValueError:
        lists = []  # malformed: must be refused
    inside = lists is None or (lists != [] and {c for cl in lists for c in cl}
                               <= set(rb_cpus(cpus)))
    try:
        text = render(p)
    except InputError as exc:
        assert not inside, exc.message
        assert "\n" not in exc.message
        return
    assert inside
    check_systemd(p, text)
    unit = rb.parse_unit(text)
    assert unit.values("Service", "NUMAPolicy") == ["bind"]
    assert [ln for ln in text.splitlines() if ln.startswith("# threads: ")] == [
        f"# threads: VLLM_CPU_OMP_THREADS_BIND={bind}: " + (
            "vLLM pins one thread per core of each rank's node itself" if bind == "auto"
            else "vLLM leaves the threads unpinned" if bind == "nobind"
            else f"threads pinned to CPUs {bind} (one list per rank)")]


def rb_cpus(text: str) -> list[int]:
    from qtune.host.sysfs import parse_cpulist

    return parse_cpulist(text)


def _script_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_host_script_parses_and_its_boot_file_applies(tmp_path):
    """``sh -n`` parses the script; the tmpfiles.d file it writes, taken from
    its here-document, is applied by the real systemd-tmpfiles to a copy of
    the two-socket tree."""
    text = emit(_xeon_profile(1, "auto"), "host")
    assert text.startswith("#!/bin/sh\n")
    r = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "# The unit binds to NUMA node 0 (CPUs 0-31,64-95)" in text
    m = re.search(r"cat > (/etc/tmpfiles\.d/qtune-tiny-test\.conf) <<'EOF'\n(.*?)\nEOF\n",
                  text, re.S)
    assert m, text
    conf = tmp_path / "q.conf"
    conf.write_text(m.group(2) + "\n")
    if shutil.which("systemd-tmpfiles") is None:
        pytest.skip("systemd-tmpfiles not installed")
    root = tmp_path / "root"
    shutil.copytree(XEON / "sys", root / "sys")
    for s in SETTINGS:
        for path in root.glob(s.path.lstrip("/")):
            path.write_text("")  # a sysfs attribute takes the whole write
    subprocess.run(["systemd-tmpfiles", "--create", f"--root={root}", str(conf)],
                   check=True)
    f = probe(root=root, nvml=NoNVML())
    assert (f.thp.enabled, f.thp.defrag, f.cpu.governors) == (
        "madvise", "defer+madvise", {"performance": 128})


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=20), st.sampled_from(_SPECIAL)))
def test_host_script_commands_never_depend_on_the_profile(tmp_path, text):
    """The profile reaches the script only in comment lines: whatever its
    model id or placement text, the commands are the same."""
    plain = _script_lines(emit(sample_profile(), "host"))
    data = sample_profile().model_dump(mode="json") | {
        "model": {"id": text or "m", "path": "/m"},
        "placement": {"numa_node": 0, "cpus": "0-1", "why": text}}
    p = load(tmp_path, data)
    if p is None:
        return
    assert _script_lines(emit(p, "host")) == plain


def test_host_format_is_listed_and_takes_no_image():
    with pytest.raises(InputError) as exc:
        emit(sample_profile(), "nope")
    assert "host" in exc.value.hint.split("available: ")[1].split(", ")
    with pytest.raises(InputError, match="--image"):
        emit(sample_profile(), "host", image="x")

