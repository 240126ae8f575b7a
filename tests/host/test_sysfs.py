"""Parsers of /sys and /proc, against captured trees.

epyc-2c-1node is this project's CI machine as captured by `qtune probe
--capture` (2 vCPUs, 1 NUMA node whose meminfo shows less memory than
/proc/meminfo, SMT not supported, THP madvise).  THP and SMT variants are
made from it by rewriting the one file each parser reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qtune.engines import probe_host as probe
from qtune.host.sysfs import (
    format_cpulist,
    parse_bracketed,
    parse_cpulist,
    parse_meminfo,
    read_cpu,
    read_memory,
    read_numa,
    read_thp,
)
from tests.conftest import FIX
from tests.fakes.nvml import NoNVML

EPYC = FIX / "hosts" / "epyc-2c-1node"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0", [0]),
        ("", []),
        (None, []),
        ("0-1\n", [0, 1]),
        ("0-63,128-191", list(range(64)) + list(range(128, 192))),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


def test_format_cpulist_round_trips():
    assert format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert parse_cpulist(format_cpulist([3, 1, 2, 9])) == [1, 2, 3, 9]


@pytest.mark.parametrize(
    ("text", "active"),
    [
        ("always [madvise] never", "madvise"),
        ("[always] madvise never", "always"),
        ("always madvise [never]", "never"),
        ("always defer defer+madvise [madvise] never", "madvise"),
        ("always [defer+madvise] madvise never", "defer+madvise"),
    ],
)
def test_parse_bracketed(text, active):
    assert parse_bracketed(text) == active


def test_meminfo_node_prefix_and_units():
    m = parse_meminfo("Node 1 MemTotal:  1024 kB\nNode 1 MemFree: 512 kB\n"
                      "HugePages_Total:  4\n")
    assert m == {"MemTotal": 1024 * 1024, "MemFree": 512 * 1024, "HugePages_Total": 4}


def test_epyc_capture():
    cpu = read_cpu(EPYC)
    assert cpu.model == "AMD EPYC"
    assert (cpu.sockets, cpu.physical_cores, cpu.logical_cpus) == (1, 2, 2)
    assert cpu.smt_active is False and cpu.smt_control == "notsupported"
    assert cpu.governors == {}  # this VM exposes no cpufreq
    assert "avx512f" in cpu.flags
    nodes = read_numa(EPYC, cpu.online)
    assert [n.id for n in nodes] == [0]
    assert nodes[0].cpus == [0, 1]
    assert nodes[0].memory_total == 10184908 * 1024
    mem = read_memory(EPYC)
    assert mem.total == 24684084 * 1024
    assert read_thp(EPYC).enabled == "madvise" and read_thp(EPYC).defrag == "madvise"


def _variant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "host"
    shutil.copytree(EPYC, root)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


THP = "sys/kernel/mm/transparent_hugepage/"


def test_thp_always_with_defrag_always_is_a_finding(tmp_path):
    root = _variant(tmp_path, {THP + "enabled": "[always] madvise never\n",
                               THP + "defrag": "[always] defer defer+madvise madvise never\n"})
    facts = probe(root=root, nvml=NoNVML())
    ids = {f.id for f in facts.findings}
    assert facts.thp.enabled == "always"
    assert "thp-defrag-always" in ids


def test_thp_never_is_reported(tmp_path):
    root = _variant(tmp_path, {THP + "enabled": "always madvise [never]\n"})
    facts = probe(root=root, nvml=NoNVML())
    assert "thp-disabled" in {f.id for f in facts.findings}


def test_smt_on_two_nodes_and_governor(tmp_path):
    # A 2-socket shape: 4 logical CPUs, siblings (0,2) and (1,3), one core
    # per socket per sibling pair, two NUMA nodes, a powersave governor.
    files = {"sys/devices/system/cpu/online": "0-3\n",
             "sys/devices/system/cpu/smt/active": "1\n",
             "sys/devices/system/cpu/smt/control": "on\n",
             "sys/devices/system/node/online": "0-1\n",
             "sys/devices/system/node/node0/cpulist": "0,2\n",
             "sys/devices/system/node/node1/cpulist": "1,3\n",
             "sys/devices/system/node/node1/meminfo": "Node 1 MemTotal: 1000 kB\n"
             "Node 1 MemFree: 900 kB\n"}
    for cpu, (pkg, core) in enumerate([(0, 0), (1, 0), (0, 0), (1, 0)]):
        base = f"sys/devices/system/cpu/cpu{cpu}/"
        files[base + "topology/physical_package_id"] = f"{pkg}\n"
        files[base + "topology/core_id"] = f"{core}\n"
        files[base + "cpufreq/scaling_governor"] = "powersave\n"
    root = _variant(tmp_path, files)
    facts = probe(root=root, nvml=NoNVML())
    assert (facts.cpu.sockets, facts.cpu.physical_cores, facts.cpu.logical_cpus) == (2, 2, 4)
    assert facts.cpu.smt_active is True
    assert [n.cpus for n in facts.numa] == [[0, 2], [1, 3]]
    assert facts.numa[1].memory_total == 1000 * 1024
    ids = {f.id for f in facts.findings}
    assert "cpu-governor" in ids
    # two nodes: vLLM's CPU backend binds a rank per node, its adapter says
    import dataclasses

    from qtune.engines import ENGINES
    from qtune.host.installed import EngineInstall, InstalledEngines

    with_vllm = dataclasses.replace(facts, engines=InstalledEngines(
        "python", [EngineInstall("vllm", "0.32.0", "cpu", "python")]))
    assert "cpu-multi-numa" in {f.id for f in ENGINES["vllm"].host_findings(with_vllm)}


def test_missing_tree_does_not_crash(tmp_path):
    facts = probe(root=tmp_path, nvml=NoNVML())
    assert facts.cpu.logical_cpus >= 1
    assert len(facts.numa) == 1
    assert facts.gpus == [] and "NVML" in (facts.gpu.note or "")


def test_probe_json_shape():
    d = probe(root=EPYC, nvml=NoNVML()).to_dict()
    for key in ("cpu", "numa", "memory", "thp", "gpus", "engines", "findings"):
        assert key in d
    assert isinstance(d["numa"]["nodes"], list)
    assert isinstance(d["cpu"]["physical_cores"], int)
    assert d["gpus"] == []


def test_node_memory_smaller_than_host_is_reported():
    """The CI VM: node0 shows ~9.7 GiB of the 23.5 GiB host, where vLLM's
    CPU backend sizes its default KV budget from the node: vLLM's finding
    (with no engine installed, as on the floors' venv, nobody says it)."""
    import dataclasses

    from qtune.engines import ENGINES
    from qtune.host import probe as hardware_only
    from qtune.host.installed import EngineInstall, InstalledEngines

    bare = hardware_only(root=EPYC, nvml=NoNVML())
    facts = dataclasses.replace(bare, engines=InstalledEngines(
        "python", [EngineInstall("vllm", "0.32.0", "cpu", "python")]))
    found = {f.id: f for f in ENGINES["vllm"].host_findings(facts)}
    assert "numa-memory-view" in found and "VLLM_CPU_KVCACHE_SPACE" in found[
        "numa-memory-view"].fix
    assert "numa-memory-view" not in {f.id for f in bare.findings}
