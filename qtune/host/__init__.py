"""Host probe: what the machine is, and what on it would hurt serving.

``probe()`` returns ``HostFacts``: CPU, NUMA, memory, THP, GPUs, installed
engines and ``findings`` (each with an id, a severity, what was seen and the
concrete fix).  The probe only reads; it never changes a setting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qtune import jsonout
from qtune.host.allocators import find_allocators
from qtune.host.gpu import GPU, GPUReport, read_gpus, record_nvml
from qtune.host.installed import EngineFinder, InstalledEngines, find_engines_for
from qtune.host.settings import GOVERNOR, THP_DEFRAG, THP_ENABLED
from qtune.host.sysfs import (
    PROBED_GLOBS,
    CPUFacts,
    MemoryFacts,
    NUMANode,
    THPFacts,
    format_cpulist,
    read_cpu,
    read_memory,
    read_numa,
    read_thp,
)

__all__ = ["HostFacts", "Finding", "probe", "capture"]


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # "info" | "warning" | "error"
    seen: str
    fix: str
    # The exact shell commands that apply the fix now, then keep it across
    # reboots, where there are such commands (``qtune emit --format host``
    # writes the same ones for a profile).
    commands: list[str] = field(default_factory=list)


# How a host turns NVLink multicast off, per library that reads it.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
# Names kept in HostFacts.comm_env: no secret has these prefixes.
_COMM_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "VLLM_FLASHINFER_")


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu: CPUFacts
    numa: list[NUMANode]
    memory: MemoryFacts
    thp: THPFacts
    gpu: GPUReport
    engines: InstalledEngines
    usable_cpus: list[int]
    findings: list[Finding] = field(default_factory=list)
    nofile_limit: int | None = None  # RLIMIT_NOFILE soft limit of this process
    # GPU-communication settings in qtune's environment (a server started from
    # here inherits them): how a shared host forbids NVLink multicast, and a
    # user's choice of all-reduce backend.
    comm_env: dict[str, str] = field(default_factory=dict)
    # Memory allocators a server could preload: {name: library path}.
    allocators: dict[str, str] = field(default_factory=dict)

    @property
    def multicast_forbidden(self) -> bool:
        """NVLink multicast is turned off for NCCL, PyTorch or NVSHMEM (on a
        shared host it can put GPUs out of service)."""
        return any(self.comm_env.get(k) == v for k, v in NO_MULTICAST.items())

    @property
    def gpus(self) -> list[GPU]:
        return self.gpu.gpus

    def fingerprint(self) -> dict[str, Any]:
        """The facts a profile depends on: a profile tuned on another kind of
        host (other CPU, GPU, core count, memory) should be re-tuned."""
        fp = {
            "hostname": self.hostname,
            "cpu_model": self.cpu.model,
            "sockets": self.cpu.sockets,
            "physical_cores": self.cpu.physical_cores,
            "logical_cpus": self.cpu.logical_cpus,
            "numa_nodes": len(self.numa),
            "memory_gib": round(self.memory.total / 2**30, 1),
            "gpus": [f"{g.name} ({g.memory_total // 2**20} MiB)" for g in self.gpus],
            "driver": self.gpu.driver_version,
            "cuda": self.gpu.cuda_version,
        }
        blob = json.dumps({k: v for k, v in fp.items() if k != "hostname"})
        fp["id"] = hashlib.sha256(blob.encode()).hexdigest()[:12]
        return fp

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "cpu": dataclasses.asdict(self.cpu)
            | {"usable_cpus": format_cpulist(self.usable_cpus)},
            "numa": {
                "node_count": len(self.numa),
                "nodes": [
                    dataclasses.asdict(n) | {"cpulist": format_cpulist(n.cpus)}
                    for n in self.numa
                ],
            },
            "memory": dataclasses.asdict(self.memory),
            "thp": dataclasses.asdict(self.thp),
            "gpus": [dataclasses.asdict(g) for g in self.gpus],
            "gpu_driver": {
                "driver_version": self.gpu.driver_version,
                "cuda_version": self.gpu.cuda_version,
                "note": self.gpu.note,
            },
            "engines": {
                "python": self.engines.python,
                "installed": [dataclasses.asdict(e) for e in self.engines.engines],
                "error": self.engines.error,
                "notes": self.engines.notes,
            },
            "nofile_limit": self.nofile_limit,
            "comm_env": self.comm_env,
            "allocators": self.allocators,
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "fingerprint": self.fingerprint(),
        }


class EngineProbe(EngineFinder, Protocol):
    """An engine adapter as the probe sees it: it finds its install
    (``EngineFinder``) and adds its findings about the host."""

    def host_findings(self, facts: HostFacts) -> list[Finding]: ...


def probe(
    *,
    root: Path = Path("/"),
    engine_python: str | None = None,
    nvml: Any = None,
    usable_cpus: list[int] | None = None,
    environ: Mapping[str, str] | None = None,
    engines: Sequence[EngineProbe] = (),
) -> HostFacts:
    """This host's facts and findings.  ``engines``: the adapters that find
    the installed engines and add their own findings (``qtune.engines``
    passes them all: ``qtune.engines.probe_host``); none, the hardware only."""
    cpu = read_cpu(root)
    numa = read_numa(root, cpu.online)
    if usable_cpus is None:
        usable_cpus = (
            sorted(os.sched_getaffinity(0)) if root == Path("/") else cpu.online
        )
    facts = HostFacts(
        hostname=os.uname().nodename if root == Path("/") else root.name,
        cpu=cpu,
        numa=numa,
        memory=read_memory(root),
        thp=read_thp(root),
        gpu=read_gpus(nvml, root),
        # (without adapters: the host's hardware only, no engine subprocess,
        # and no "no engine" finding)
        engines=(find_engines_for(engine_python, sys.executable, engines) if engines
                 else InstalledEngines(engine_python or sys.executable, [], searched=False)),
        usable_cpus=usable_cpus,
        nofile_limit=_nofile() if root == Path("/") else None,
        comm_env=comm_env(os.environ if environ is None and root == Path("/")
                          else environ or {}),
        allocators=find_allocators(root),
    )
    return dataclasses.replace(facts, findings=findings(facts) + [
        f for e in engines for f in e.host_findings(facts)])


def comm_env(environ: Mapping[str, str]) -> dict[str, str]:
    # The prefixes hold no credential today; the second test keeps it so.
    return {k: v for k, v in sorted(environ.items()) if k.startswith(_COMM_PREFIXES)
            and not any(w in k for w in ("TOKEN", "KEY", "SECRET", "PASSWORD"))}


def _nofile() -> int | None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def gpu_numa_node(facts: HostFacts, gpu: GPU) -> int | None:
    """The GPU's NUMA node; when sysfs and NVML do not say (common in VMs),
    the node whose CPUs are the device's local CPUs."""
    if gpu.numa_node is not None:
        return gpu.numa_node
    local = set(gpu.local_cpus)
    for n in facts.numa:
        if local and local <= set(n.cpus):
            return n.id
    return None


def cpu_binding(facts: HostFacts) -> list[int]:
    """The CPUs a server would be bound to: the NUMA node of the first GPU,
    else node 0, restricted to what this process may use."""
    node = gpu_numa_node(facts, facts.gpus[0]) if facts.gpus else None
    chosen = next((n for n in facts.numa if n.id == node), facts.numa[0])
    cpus = [c for c in chosen.cpus if c in facts.usable_cpus]
    return cpus or facts.usable_cpus


def placement(facts: HostFacts, n_gpus: int = 1) -> dict[str, Any]:
    """Where a server should run: the NUMA node of the GPUs it uses (the
    first ``n_gpus``), or node 0 for CPU serving with one rank (``n_gpus``
    counts CPU ranks there), with that node's CPUs.
    ``numa_node`` is None when there is nothing to choose (one node) or no
    way to know (GPUs on different or unknown nodes); ``why`` says which."""
    if len(facts.numa) < 2:
        return {"numa_node": None, "cpus": None,
                "why": "one NUMA node: no placement needed"}
    if facts.gpus:
        nodes = {gpu_numa_node(facts, g) for g in facts.gpus[:max(n_gpus, 1)]}
        if len(nodes) != 1 or None in nodes:
            return {"numa_node": None, "cpus": None,
                    "why": "the GPUs are on different or unknown NUMA nodes"}
        node = nodes.pop()
        why = f"GPU {facts.gpus[0].index} is attached to NUMA node {node}"
    elif n_gpus > 1:
        # vLLM's CPU worker binds each rank's threads, and its memory
        # (numa_set_membind), to the node of its CPUs: a unit bound to one
        # node would leave the other ranks no node of their own.
        return {"numa_node": None, "cpus": None,
                "why": f"{n_gpus} CPU ranks, one per NUMA node: vLLM binds each "
                       "rank's threads and memory to its node"}
    else:
        node = facts.numa[0].id
        why = "CPU serving: one node's cores and memory (no cross-node traffic)"
    chosen = next(n for n in facts.numa if n.id == node)
    cpus = [c for c in chosen.cpus if c in facts.usable_cpus] or chosen.cpus
    return {"numa_node": node, "cpus": format_cpulist(cpus), "why": why}


def findings(facts: HostFacts) -> list[Finding]:
    """What on this host hurts serving, each with its fix (the engines'
    own findings are added by ``qtune.engines.probe_host``)."""
    return [*_kernel_findings(facts), *_gpu_findings(facts), *_engine_findings(facts),
            *_limit_findings(facts)]


def _kernel_findings(facts: HostFacts) -> list[Finding]:
    """Transparent huge pages, the CPU governor, isolated CPUs."""
    out: list[Finding] = []
    thp = facts.thp
    if thp.defrag == "always":
        out.append(
            Finding(
                "thp-defrag-always",
                "warning",
                "transparent_hugepage/defrag is 'always': page faults may stall "
                "on synchronous compaction (latency spikes)",
                THP_DEFRAG.now,
                THP_DEFRAG.commands(),
            )
        )
    if thp.enabled == "never":
        out.append(
            Finding(
                "thp-disabled",
                "info",
                "transparent huge pages are disabled: large tensors pay more TLB misses",
                THP_ENABLED.now,
                THP_ENABLED.commands(),
            )
        )
    slow = {g: n for g, n in facts.cpu.governors.items() if g != "performance"}
    if slow:
        seen = ", ".join(f"{n} CPUs on '{g}'" for g, n in sorted(slow.items()))
        out.append(
            Finding(
                "cpu-governor",
                "warning",
                f"CPU frequency governor is not 'performance' ({seen})",
                "cpupower frequency-set -g performance  (or tuned-adm profile "
                "throughput-performance)",
                GOVERNOR.commands(),
            )
        )
    if facts.cpu.isolated:
        out.append(
            Finding(
                "isolated-cpus",
                "info",
                f"CPUs {format_cpulist(facts.cpu.isolated)} are isolated (isolcpus)",
                "bind the server to them explicitly, or they stay idle",
            )
        )
    return out


def _gpu_findings(facts: HostFacts) -> list[Finding]:
    """Each GPU: its NUMA node against the binding, its PCIe link, persistence mode."""
    out: list[Finding] = []
    bind = cpu_binding(facts)
    for g in facts.gpus:
        node_id = gpu_numa_node(facts, g)
        gpu_node = next((n for n in facts.numa if n.id == node_id), None)
        if gpu_node and not set(bind) & set(gpu_node.cpus):
            out.append(
                Finding(
                    f"gpu{g.index}-numa-remote",
                    "warning",
                    f"GPU {g.index} sits on NUMA node {node_id} but the CPUs "
                    f"qtune would bind ({format_cpulist(bind)}) are elsewhere",
                    f"bind the server to node {node_id}: CPUAffinity="
                    f"{format_cpulist(gpu_node.cpus)} NUMAPolicy=bind "
                    f"NUMAMask={node_id}",
                )
            )
        if g.pcie_gen and g.pcie_gen_max and g.pcie_width_max and g.pcie_width:
            if g.pcie_width < g.pcie_width_max:
                out.append(
                    Finding(
                        f"gpu{g.index}-pcie-width",
                        "warning",
                        f"GPU {g.index} PCIe link runs x{g.pcie_width} of "
                        f"x{g.pcie_width_max}",
                        "reseat the card or check the slot/riser; width does not "
                        "drop at idle (generation does)",
                    )
                )
        if g.persistence_mode is False:
            out.append(
                Finding(
                    f"gpu{g.index}-persistence",
                    "info",
                    f"GPU {g.index} persistence mode is off: first CUDA init is slower",
                    "nvidia-smi -pm 1  (or enable nvidia-persistenced)",
                )
            )
    return out


def _engine_findings(facts: HostFacts) -> list[Finding]:
    """What the GPUs' communication and the engines found say."""
    out: list[Finding] = []
    if len(facts.gpus) > 1 and facts.multicast_forbidden:
        off = ", ".join(f"{k}={v}" for k, v in facts.comm_env.items() if k in NO_MULTICAST)
        out.append(
            Finding(
                "nvlink-multicast-off",
                "info",
                f"NVLink multicast is turned off here ({off}); FlashInfer's "
                "fused all-reduce creates multicast objects of its own and "
                "crashed or hung on such a host",
                "nothing to do: qtune launches tensor-parallel servers with that "
                "fusion off here, and its units carry these settings",
            )
        )
    for note in facts.engines.notes:
        out.append(Finding("engine-incomplete", "warning", note,
                           "install the missing parts, or tune another --engine"))
    if facts.engines.searched and not facts.engines.engines:
        out.append(
            Finding(
                "no-engine",
                "warning",
                f"no inference engine found for {facts.engines.python}",
                "pip install 'qtune[cpu]' (CPU) or 'qtune[vllm]' (GPU), or pass "
                "--engine-python /path/to/engine/venv/bin/python",
            )
        )
    return out


def _limit_findings(facts: HostFacts) -> list[Finding]:
    """The open-files limit and the memory available now."""
    out: list[Finding] = []
    if facts.nofile_limit is not None and facts.nofile_limit < 65536:
        out.append(
            Finding(
                "open-files-limit",
                "info",
                # (no engine named: a host whose only engine is Transformers was
                # told "vLLM warns", GPU run 20)
                f"open-files limit is {facts.nofile_limit}, under 65536: every concurrent "
                "stream holds a socket, and many can hit 'Too many open files'",
                "ulimit -n 65536 for manual runs; the emitted unit sets LimitNOFILE=65536",
            )
        )
    avail = facts.memory.available / max(facts.memory.total, 1)
    if facts.memory.total and avail < 0.2:
        out.append(
            Finding(
                "low-memory",
                "warning",
                f"only {avail:.0%} of memory is available",
                "stop other workloads before tuning; measurements will be noisy",
            )
        )
    return out


def capture(dest: Path, *, root: Path = Path("/"), nvml: Any = None) -> int:
    """Copy the /sys and /proc files the probe reads into ``dest`` (a
    fixture or a bug report), plus NVML answers as ``nvml.json``.  Every file
    goes through ``qtune.files.Folder``: never through a link inside ``dest``."""
    import glob

    from qtune.files import Folder

    n = 0
    with Folder(dest, "--capture") as folder:
        for pattern in PROBED_GLOBS:
            for src in glob.glob(str(root / pattern)):
                rel = Path(src).relative_to(root)
                try:
                    data = Path(src).read_bytes()
                except OSError:
                    continue
                folder.write(rel, data)
                n += 1
        report = read_gpus(nvml, root)
        for g in report.gpus:
            bdf = g.pci_bus_id.lower()
            bdf = bdf[4:] if len(bdf.split(":")[0]) == 8 else bdf
            for name in ("numa_node", "local_cpulist"):
                dev_file = root / "sys/bus/pci/devices" / bdf / name
                try:
                    data = dev_file.read_bytes()
                except OSError:
                    continue
                folder.write(dev_file.relative_to(root), data)
                n += 1
        folder.write("nvml.json", jsonout.dumps(record_nvml(nvml), indent=1) + "\n")
        folder.write("gpus.json", jsonout.dumps(dataclasses.asdict(report), indent=1) + "\n")
    return n + 2
