"""GPU facts through NVML, replayed from captures of real H200 hosts.

h200 and h200x2 were captured with ``qtune.host.capture`` (nvidia-ml-py
13.610.43, driver 580.159.04) on this workplace's lent machines: Firecracker
VMs with one H200 (16 vCPUs) and two NVLinked H200s (32 vCPUs).  The literals
below come from the captured files and from ``nvidia-smi`` run beside the
capture (``-q``: 143771 MiB, CUDA Version 13.0, persistence Enabled, MIG
Disabled; ``topo -m``: GPU0-GPU1 NV18, CPU affinity 0-15 / 0-31, GPU NUMA ID
N/A; ``nvlink -s``: links 0-17 up at 26.562 GB/s), not from the code under
test.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from qtune.engines import probe_host as probe
from qtune.host import cpu_binding
from qtune.host.gpu import read_gpus, record_nvml
from tests.conftest import FIX
from tests.fakes.nvml import NoNVML, NVMLError, ReplayNVML

H200 = FIX / "hosts" / "h200"
H200X2 = FIX / "hosts" / "h200x2"

# Findings that depend on the Python running the tests (which engines it has,
# whether this machine has tcmalloc), not on the captured host.
ENGINE_FINDINGS = {"no-engine", "no-tcmalloc", "vllm-cuda-no-gpu", "vllm-cpu-build-on-gpu-host",
                   "engine-incomplete"}

H200_BYTES = 143771 * 2**20  # nvidia-smi: FB memory total 143771 MiB


def record(host: Path) -> dict:
    return json.loads((host / "nvml.json").read_text())


def replay(host: Path) -> ReplayNVML:
    return ReplayNVML(record(host))


def host_findings(facts) -> dict[str, object]:
    return {f.id: f for f in facts.findings if f.id not in ENGINE_FINDINGS}


# -- the replay itself ----------------------------------------------------


@pytest.mark.parametrize("host", [H200, H200X2], ids=["h200", "h200x2"])
def test_replay_reproduces_the_record(host):
    # record_nvml asks the same calls the real pynvml answered on the host.
    assert record_nvml(replay(host)) == record(host)


@pytest.mark.parametrize("host", [H200, H200X2], ids=["h200", "h200x2"])
def test_read_gpus_matches_what_the_host_parsed(host):
    # gpus.json is read_gpus() as it ran on the real host with real pynvml.
    report = read_gpus(replay(host), root=host)
    assert dataclasses.asdict(report) == json.loads((host / "gpus.json").read_text())


def test_read_gpus_shuts_nvml_down():
    nvml = replay(H200)
    read_gpus(nvml, root=H200)
    assert nvml.initialized == 0


def test_replay_raises_recorded_errors():
    nvml = replay(H200)
    with pytest.raises(NVMLError) as exc:
        nvml.nvmlDeviceGetNumaNodeId(0)
    assert type(exc.value).__name__ == "NVMLError_NotSupported"
    with pytest.raises(NVMLError):
        nvml.nvmlDeviceGetHandleByIndex(1)


# -- one H200 -------------------------------------------------------------


def test_h200_gpu_fields():
    report = read_gpus(replay(H200), root=H200)
    assert report.driver_version == "580.159.04"
    assert report.cuda_version == "13.0"  # NVML 13000
    assert report.note is None
    assert len(report.gpus) == 1
    g = report.gpus[0]
    assert g.index == 0
    assert g.name == "NVIDIA H200"
    assert "H200" in g.name
    assert g.uuid == "GPU-3f9dacc7-a46c-24c9-0788-83ea4eb42f3c"
    assert g.memory_total == 150754820096 == H200_BYTES  # 140.4 GiB, 150.8 GB
    assert 139 * 2**30 < g.memory_total < 141 * 2**30
    assert g.memory_free == 150109880320
    assert g.compute_capability == "9.0"
    assert g.pci_bus_id == "00000000:00:06.0"
    # sysfs numa_node is -1 and NVML's NumaNodeId is NotSupported in this VM:
    # the platform does not say, so neither does the probe.
    sysfs = H200 / "sys/bus/pci/devices/0000:00:06.0"
    assert (sysfs / "numa_node").read_text().strip() == "-1"
    assert g.numa_node is None
    assert g.local_cpus == list(range(16))  # local_cpulist 0-15
    pcie = (g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max)
    assert pcie == (5, 16, 5, 16)
    # NVLink is not exposed to a single-GPU VM: every link is NotSupported.
    assert g.nvlink_active_links == 0
    assert g.nvlink_peers == []
    assert g.mig_enabled is False
    assert g.persistence_mode is True


def test_h200_host_facts():
    facts = probe(root=H200, nvml=replay(H200), engine_python=sys.executable)
    cpu = facts.cpu
    assert cpu.model == "Intel(R) Xeon(R) Processor"  # the VM hides the SKU
    assert cpu.sockets == 1
    assert cpu.physical_cores == 16
    assert cpu.logical_cpus == 16
    assert cpu.online == list(range(16))
    assert cpu.smt_active is False
    assert cpu.smt_control == "notsupported"
    assert cpu.isolated == []
    amx = {"avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}
    assert amx <= set(cpu.flags)
    assert cpu.governors == {}  # no cpufreq in the VM
    assert [n.id for n in facts.numa] == [0]
    assert facts.numa[0].cpus == list(range(16))
    assert facts.numa[0].memory_total == 4550128 * 1024
    assert facts.memory.total == 131981020 * 1024
    assert facts.memory.available == 131484560 * 1024
    assert facts.memory.hugepages_total == 0
    assert facts.memory.hugepage_size == 2048 * 1024
    assert (facts.thp.enabled, facts.thp.defrag) == ("madvise", "madvise")
    assert [g.name for g in facts.gpus] == ["NVIDIA H200"]
    assert cpu_binding(facts) == list(range(16))
    fp = facts.fingerprint()
    assert fp["gpus"] == ["NVIDIA H200 (143771 MiB)"]
    assert (fp["driver"], fp["cuda"], fp["numa_nodes"]) == ("580.159.04", "13.0", 1)
    assert fp["memory_gib"] == 125.9


@pytest.mark.engine
def test_h200_findings():
    facts = probe(root=H200, nvml=replay(H200), engine_python=sys.executable)
    found = host_findings(facts)
    # THP madvise/madvise, no cpufreq, PCIe x16 of x16, persistence on, one
    # node, 99% memory free: nothing to fix but the node's memory view
    # (node0 meminfo 4.3 GiB of a 125.9 GiB VM: hot-plugged memory).
    assert set(found) == {"numa-memory-view"}
    assert "4.3 GiB" in found["numa-memory-view"].seen
    assert "125.9 GiB" in found["numa-memory-view"].seen


def test_h200_to_dict_is_json():
    facts = probe(root=H200, nvml=replay(H200), engine_python=sys.executable)
    d = json.loads(json.dumps(facts.to_dict()))
    assert d["gpus"][0]["memory_total"] == H200_BYTES
    assert d["gpu_driver"] == {"driver_version": "580.159.04", "cuda_version": "13.0",
                               "note": None}


# -- two NVLinked H200s ---------------------------------------------------


def test_h200x2_gpu_fields():
    report = read_gpus(replay(H200X2), root=H200X2)
    assert (report.driver_version, report.cuda_version) == ("580.159.04", "13.0")
    g0, g1 = report.gpus
    assert [g.index for g in report.gpus] == [0, 1]
    assert g0.uuid == "GPU-4d44b188-25d2-522f-4f9f-652ae58c9129"
    assert g1.uuid == "GPU-2baf014f-424b-2cc5-8e2d-9f4f2ae98cc4"
    assert (g0.pci_bus_id, g1.pci_bus_id) == ("00000000:00:06.0", "00000000:00:07.0")
    for g in (g0, g1):
        assert g.name == "NVIDIA H200"
        assert g.memory_total == H200_BYTES
        assert g.compute_capability == "9.0"
        assert g.numa_node is None
        assert g.local_cpus == list(range(32))
        pcie = (g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max)
        assert pcie == (5, 16, 5, 16)
        assert g.nvlink_active_links == 18  # topo: NV18; nvlink -s: links 0-17
        assert g.mig_enabled is False
        assert g.persistence_mode is True
    assert g0.nvlink_peers == [1]
    assert g1.nvlink_peers == [0]


@pytest.mark.engine
def test_h200x2_host_facts_and_findings():
    facts = probe(root=H200X2, nvml=replay(H200X2), engine_python=sys.executable)
    assert facts.cpu.model == "Intel(R) Xeon(R) Processor"
    cpu = facts.cpu
    assert (cpu.sockets, cpu.physical_cores, cpu.logical_cpus) == (1, 32, 32)
    assert facts.cpu.smt_active is False
    assert len(facts.numa) == 1
    assert facts.numa[0].cpus == list(range(32))
    assert facts.memory.total == 263998500 * 1024
    assert (facts.thp.enabled, facts.thp.defrag) == ("madvise", "madvise")
    assert len(facts.gpus) == 2
    assert set(host_findings(facts)) == {"numa-memory-view"}


# The lent 2xH200 machine's environment (seen in run 4), with secrets beside it.
X2_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
          "NVSHMEM_DISABLE_NVLS": "1", "HF_TOKEN": "hf_secret", "VLLM_API_KEY": "k",
          "NCCL_SOME_TOKEN": "hf_secret",
          "PATH": "/usr/bin"}


@pytest.mark.engine
def test_a_host_that_forbids_nvlink_multicast_says_so():
    facts = probe(root=H200X2, nvml=replay(H200X2), engine_python=sys.executable,
                  environ=X2_ENV)
    assert facts.multicast_forbidden
    # Only communication settings are kept: never a token or key.
    assert facts.comm_env == {k: X2_ENV[k] for k in
                              ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS",
                               "TORCH_SYMM_MEM_DISABLE_MULTICAST")}
    assert "hf_secret" not in json.dumps(facts.to_dict())
    found = host_findings(facts)
    assert set(found) == {"numa-memory-view", "nvlink-multicast-off"}
    assert "NCCL_NVLS_ENABLE=0" in found["nvlink-multicast-off"].seen
    # One GPU: nothing to all-reduce across, nothing to say.
    one = probe(root=H200, nvml=replay(H200), engine_python=sys.executable, environ=X2_ENV)
    assert one.multicast_forbidden and "nvlink-multicast-off" not in host_findings(one)
    # Multicast allowed (a value other than the "off" one): no finding.
    on = probe(root=H200X2, nvml=replay(H200X2), engine_python=sys.executable,
               environ={"NCCL_NVLS_ENABLE": "1"})
    assert not on.multicast_forbidden and "nvlink-multicast-off" not in host_findings(on)


def degraded_x2() -> dict:
    # The real record, with GPU 1's link trained down and persistence off.
    rec = copy.deepcopy(record(H200X2))
    rec["devices"][1]["pcie_width"] = 8
    rec["devices"][1]["persistence_mode"] = 0
    return rec


def test_degraded_gpu_answers_are_parsed():
    g0, g1 = read_gpus(ReplayNVML(degraded_x2()), root=H200X2).gpus
    assert (g0.pcie_width, g0.persistence_mode) == (16, True)
    assert (g1.pcie_width, g1.pcie_width_max, g1.persistence_mode) == (8, 16, False)


@pytest.mark.engine
def test_findings_from_degraded_gpu_answers():
    rec = degraded_x2()
    facts = probe(root=H200X2, nvml=ReplayNVML(rec), engine_python=sys.executable)
    found = host_findings(facts)
    assert set(found) == {"numa-memory-view", "gpu1-pcie-width", "gpu1-persistence"}
    assert "x8 of x16" in found["gpu1-pcie-width"].seen


def test_nvlink_down_means_no_peers():
    rec = copy.deepcopy(record(H200X2))
    for d in rec["devices"]:
        d["nvlink_state"] = [0 if s == 1 else s for s in d["nvlink_state"]]
    report = read_gpus(ReplayNVML(rec), root=H200X2)
    links = [(g.nvlink_active_links, g.nvlink_peers) for g in report.gpus]
    assert links == [(0, []), (0, [])]


# -- no driver ------------------------------------------------------------


def test_init_failure_gives_empty_list_and_note():
    report = read_gpus(NoNVML(), root=H200)
    assert report.gpus == []
    assert report.driver_version is None and report.cuda_version is None
    assert report.note is not None
    assert "no NVIDIA driver found" in report.note
    assert "NVML Shared Library Not Found" in report.note


def test_recorded_no_driver_gives_empty_list_and_note():
    report = read_gpus(ReplayNVML({"error": "Driver Not Loaded"}), root=H200)
    assert report.gpus == []
    assert "Driver Not Loaded" in report.note


def test_probe_survives_no_driver_on_the_gpu_host():
    facts = probe(root=H200, nvml=NoNVML(), engine_python=sys.executable)
    assert facts.gpus == []
    assert facts.cpu.physical_cores == 16
    assert cpu_binding(facts) == list(range(16))
    assert facts.to_dict()["gpu_driver"]["note"].startswith("no NVIDIA driver found")


def test_error_after_init_gives_note():
    rec = copy.deepcopy(record(H200))
    rec["devices"][0]["memory"] = {"nvml_error": "NVMLError_GpuIsLost"}
    report = read_gpus(ReplayNVML(rec), root=H200)
    assert report.gpus == [] and report.note


def test_gpu_numa_node_derived_from_local_cpus():
    from qtune.host import gpu_numa_node

    facts = probe(root=H200, nvml=ReplayNVML(record(H200)), engine_python=sys.executable)
    # sysfs says -1 and NVML NotSupported; local_cpulist 0-15 is node 0.
    assert facts.gpus[0].numa_node is None
    assert gpu_numa_node(facts, facts.gpus[0]) == 0


def test_placement_follows_the_gpu_numa_node(cpu_host):
    import dataclasses

    from qtune.host import placement
    from qtune.host.gpu import GPU, GPUReport
    from qtune.host.sysfs import NUMANode

    assert placement(cpu_host)["numa_node"] is None  # one node
    two = [NUMANode(0, [0, 1, 2, 3], None, None), NUMANode(1, [4, 5, 6, 7], None, None)]

    def gpu(i, node):
        return GPU(i, "NVIDIA H200", f"GPU-{i}", 2**37, 2**37, "9.0", f"0000:0{i}:00.0",
                   node, [], 5, 16, 5, 16)

    host = dataclasses.replace(cpu_host, numa=two, usable_cpus=list(range(8)),
                               gpu=GPUReport([gpu(0, 1), gpu(1, 0)], "580", "13.0", None))
    p = placement(host)
    assert (p["numa_node"], p["cpus"]) == (1, "4-7") and "GPU 0" in p["why"]
    # TP 2 over GPUs on different nodes: no single right node.
    assert placement(host, 2)["numa_node"] is None
    cpu_only = dataclasses.replace(host, gpu=GPUReport([], None, None, None))
    assert placement(cpu_only)["cpus"] == "0-3"
