"""CPU-build host dimensions (thread binding, reserved cores, allocator) on
a hand-written two-socket capture and on this machine, for real.

xeon-2s-32c-smt: 2 x 32 cores, SMT, nodes 0-31,64-95 and 32-63,96-127
(its README says where the layout comes from).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from qtune.engines.vllm_cpubind import (
    bind_choices,
    bind_cpus,
    fewest_cores,
    reserve_choices,
)
from qtune.host import placement, probe
from qtune.host.allocators import find_allocators
from qtune.host.settings import GOVERNOR, SETTINGS
from tests.conftest import FIX
from tests.fakes.nvml import NoNVML

XEON = FIX / "hosts" / "xeon-2s-32c-smt"
EPYC = FIX / "hosts" / "epyc-2c-1node"


def _probe(root: Path):
    return probe(root=root, nvml=NoNVML())


def _topo(facts):
    return [(n.id, n.cpus) for n in facts.numa], facts.usable_cpus, facts.cpu.cores


def test_two_socket_capture_reads_as_lscpu_shows_it():
    f = _probe(XEON)
    assert (f.cpu.sockets, f.cpu.physical_cores, f.cpu.logical_cpus) == (2, 64, 128)
    assert f.cpu.smt_active
    assert [n.cpus for n in f.numa] == [list(range(32)) + list(range(64, 96)),
                                        list(range(32, 64)) + list(range(96, 128))]
    # SMT siblings n and n+64 share a core
    assert len(f.cpu.cores) == 64 and f.cpu.cores[5] == [5, 69]
    assert "amx_bf16" in f.cpu.flags


def test_two_socket_bindings_per_rank_count():
    topo = _topo(_probe(XEON))
    one = {c.value: c.why for c in bind_choices(*topo, 1)}
    assert list(one) == ["auto", "nobind", "0-31,64-95"]
    assert "first NUMA node" in one["auto"] and "SMT" in one["0-31,64-95"]
    two = [c.value for c in bind_choices(*topo, 2)]
    # tensor parallel 2: one rank per node, vLLM's "|" form
    assert two == ["auto", "nobind", "0-31,64-95|32-63,96-127"]
    # three ranks do not fit two nodes: auto would assert, no list is offered
    assert [c.value for c in bind_choices(*topo, 3)] == ["nobind"]
    assert bind_cpus("0-31,64-95|32-63,96-127")[1][:2] == [32, 33]


def test_two_socket_reserve_choices_leave_every_rank_a_core():
    topo = _topo(_probe(XEON))
    assert fewest_cores(*topo, 2) == 32
    assert reserve_choices(*topo, 1) == (0, 1, 2)
    assert reserve_choices(*topo, 2) == (0, 2, 4)
    assert reserve_choices(*topo, 3) == ()


def test_a_restricted_affinity_narrows_the_choices():
    """A process allowed only node 1's CPUs (taskset, cgroup cpuset): auto
    puts rank 0 there, and two ranks no longer fit."""
    f = _probe(XEON)
    node1 = f.numa[1].cpus
    topo = ([(n.id, n.cpus) for n in f.numa], node1, f.cpu.cores)
    assert [c.value for c in bind_choices(*topo, 1)] == ["auto", "nobind",
                                                         "32-63,96-127"]
    assert [c.value for c in bind_choices(*topo, 2)] == ["nobind"]


def test_single_node_capture_has_no_smt_list():
    topo = _topo(_probe(EPYC))
    assert [c.value for c in bind_choices(*topo, 1)] == ["auto", "nobind"]
    assert reserve_choices(*topo, 1) == (0, 1)


def test_this_host_for_real():
    """The single-node path on the machine the tests run on: every usable
    CPU sits in exactly one core group, and the choices fit its topology."""
    f = probe(nvml=NoNVML())
    flat = sorted(c for g in f.cpu.cores for c in g)
    assert flat == sorted(f.cpu.online)
    values = [c.value for c in bind_choices(*_topo(f), 1)]
    assert values[:2] == ["auto", "nobind"]
    assert (len(values) == 3) == any(len(g) > 1 for g in f.cpu.cores)
    if len(f.numa) == 1:
        assert placement(f, 1)["numa_node"] is None
    usable_cores = {i for i, g in enumerate(f.cpu.cores) if set(g) & set(f.usable_cpus)}
    assert max(reserve_choices(*_topo(f), 1)) < len(usable_cores)


@pytest.mark.parametrize("bad", ["", "0-", "a", "0-3|", "0;rm"])
def test_malformed_bind_lists_are_refused(bad):
    with pytest.raises(ValueError):
        bind_cpus(bad)


def test_placement_of_cpu_ranks():
    f = _probe(XEON)
    one = placement(f, 1)
    assert (one["numa_node"], one["cpus"]) == (0, "0-31,64-95")
    two = placement(f, 2)
    assert two["numa_node"] is None and "one per NUMA node" in two["why"]


def test_allocators_found_under_root(tmp_path):
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    assert find_allocators(tmp_path) == {}
    (lib / "libtcmalloc_minimal.so.4").write_bytes(b"")
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libjemalloc.so.2").write_bytes(b"")
    assert find_allocators(tmp_path) == {
        "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "jemalloc": "/usr/lib64/libjemalloc.so.2"}


def test_findings_carry_the_commands(tmp_path):
    by_id = {x.id: x for x in _probe(XEON).findings}
    gov = by_id["cpu-governor"]
    assert "128 CPUs on 'powersave'" in gov.seen
    assert gov.commands == GOVERNOR.commands()


@pytest.mark.skipif(not os.path.exists("/usr/bin/systemd-tmpfiles"),
                    reason="systemd-tmpfiles not installed")
def test_commands_set_the_values_in_a_copied_tree(tmp_path):
    """Each setting's two commands (now, at boot), run against a copy of the
    two-socket tree: the shell line with the path under the copy, the
    tmpfiles.d line by the real systemd-tmpfiles --root."""
    import shutil

    root = tmp_path / "now"
    shutil.copytree(XEON / "sys", root / "sys")
    for s in SETTINGS:
        cmd = s.now.replace(" /sys/", f" {root}/sys/")
        subprocess.run(["sh", "-eu", "-c", cmd], check=True)
    boot = tmp_path / "boot"
    shutil.copytree(XEON / "sys", boot / "sys")
    # tmpfiles writes without truncating; a sysfs attribute takes the whole
    # write as its value, a regular file would keep the old tail.
    for s in SETTINGS:
        for path in boot.glob(s.path.lstrip("/")):
            path.write_text("")
    conf = tmp_path / "q.conf"
    conf.write_text("".join(s.tmpfiles + "\n" for s in SETTINGS))
    subprocess.run(["systemd-tmpfiles", "--create", f"--root={boot}", str(conf)],
                   check=True)
    for tree in (root, boot):
        f = _probe(tree)
        assert (f.thp.enabled, f.thp.defrag) == ("madvise", "defer+madvise")
        assert f.cpu.governors == {"performance": 128}
        assert not {"cpu-governor", "thp-defrag-always"} & {x.id for x in f.findings}
