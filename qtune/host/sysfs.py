"""Read CPU, NUMA, memory, THP and governor facts from /sys and /proc.

Every reader takes ``root`` so tests can point it at a captured tree
(``tests/fixtures/hosts/<shape>/``).  Files that are missing (VMs often lack
cpufreq; containers may hide node/) give ``None`` rather than an exception:
a probe must never crash on an unusual host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# The files the probe reads, relative to root.  ``capture`` copies exactly
# these, so a fixture holds what the parsers see and nothing else.
PROBED_GLOBS = (
    "proc/cpuinfo",
    "proc/meminfo",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/isolated",
    "sys/devices/system/cpu/smt/active",
    "sys/devices/system/cpu/smt/control",
    "sys/devices/system/cpu/cpu[0-9]*/topology/core_id",
    "sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    "sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor",
    "sys/devices/system/node/online",
    "sys/devices/system/node/node[0-9]*/cpulist",
    "sys/devices/system/node/node[0-9]*/meminfo",
    "sys/kernel/mm/transparent_hugepage/enabled",
    "sys/kernel/mm/transparent_hugepage/defrag",
)


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text().strip()
    except OSError:
        return None


def parse_cpulist(text: str | None) -> list[int]:
    """Parse the kernel's CPU list format: ``0-3,8,10-11`` → [0,1,2,3,8,10,11]."""
    cpus: list[int] = []
    if not text:
        return cpus
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus: list[int]) -> str:
    """Inverse of ``parse_cpulist``, compressing runs: [0,1,2,5] → ``0-2,5``."""
    out: list[str] = []
    cpus = sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def parse_bracketed(text: str | None) -> str | None:
    """``always [madvise] never`` → ``madvise`` (the active choice)."""
    if not text:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.split()[0]


def parse_meminfo(text: str | None) -> dict[str, int]:
    """``/proc/meminfo`` or a node's meminfo → {key: bytes}."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        # Node files prefix "Node 0 "; strip it so keys match /proc/meminfo.
        line = re.sub(r"^Node \d+\s+", "", line)
        m = re.match(r"([\w()]+):\s+(\d+)(?:\s+kB)?", line)
        if m:
            mult = 1024 if line.rstrip().endswith("kB") else 1
            out[m.group(1)] = int(m.group(2)) * mult
    return out


@dataclass(frozen=True)
class CPUFacts:
    model: str
    sockets: int
    physical_cores: int
    logical_cpus: int
    smt_active: bool
    smt_control: str | None
    online: list[int]
    isolated: list[int]
    flags: list[str] = field(default_factory=list)
    governors: dict[str, int] = field(default_factory=dict)  # governor → #cpus
    # Online logical CPUs grouped by physical core (SMT siblings together),
    # ordered by their lowest CPU: what a thread binding picks from.
    cores: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class NUMANode:
    id: int
    cpus: list[int]
    memory_total: int | None
    memory_free: int | None


@dataclass(frozen=True)
class MemoryFacts:
    total: int
    available: int
    hugepages_total: int
    hugepage_size: int


@dataclass(frozen=True)
class THPFacts:
    enabled: str | None
    defrag: str | None


def read_cpu(root: Path) -> CPUFacts:
    cpuinfo = _read(root, "proc/cpuinfo") or ""
    model = "unknown"
    flags: list[str] = []
    # /proc/cpuinfo is a list of blank-line separated blocks, one per CPU.
    pairs: set[tuple[str, str]] = set()
    for block in cpuinfo.split("\n\n"):
        kv = {}
        for line in block.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                kv[k.strip()] = v.strip()
        if "model name" in kv and model == "unknown":
            model = kv["model name"]
        if "flags" in kv and not flags:
            flags = kv["flags"].split()
        if "physical id" in kv and "core id" in kv:
            pairs.add((kv["physical id"], kv["core id"]))

    online = parse_cpulist(_read(root, "sys/devices/system/cpu/online"))
    if not online:
        online = list(range(cpuinfo.count("processor\t:") or 1))
    # sysfs topology is authoritative when present (cpuinfo lacks core ids on
    # some arm64 kernels); fall back to cpuinfo pairs, then to logical CPUs.
    topo: set[tuple[str, str]] = set()
    packages: set[str] = set()
    by_core: dict[tuple[str, str], list[int]] = {}
    for cpu in online:
        base = f"sys/devices/system/cpu/cpu{cpu}/topology"
        pkg = _read(root, f"{base}/physical_package_id")
        core = _read(root, f"{base}/core_id")
        if pkg is not None and core is not None:
            topo.add((pkg, core))
            packages.add(pkg)
            by_core.setdefault((pkg, core), []).append(cpu)
    if topo:
        physical = len(topo)
        sockets = len(packages)
    elif pairs:
        physical = len(pairs)
        sockets = len({p for p, _ in pairs})
    else:
        physical, sockets = len(online), 1

    smt_active_text = _read(root, "sys/devices/system/cpu/smt/active")
    smt_active = (
        smt_active_text == "1"
        if smt_active_text is not None
        else len(online) > physical
    )
    governors: dict[str, int] = {}
    for cpu in online:
        g = _read(root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
        if g:
            governors[g] = governors.get(g, 0) + 1
    return CPUFacts(
        model=model,
        sockets=max(sockets, 1),
        physical_cores=physical,
        logical_cpus=len(online),
        smt_active=smt_active,
        smt_control=_read(root, "sys/devices/system/cpu/smt/control"),
        online=online,
        isolated=parse_cpulist(_read(root, "sys/devices/system/cpu/isolated")),
        flags=[f for f in flags if f in _INTERESTING_FLAGS],
        governors=governors,
        cores=_cores(root, online, by_core),
    )


def _cores(root: Path, online: list[int],
           by_core: dict[tuple[str, str], list[int]]) -> list[list[int]]:
    """Logical CPUs per physical core: the kernel's sibling lists, else the
    (package, core id) pairs, else one CPU per core (no topology at all)."""
    seen: set[int] = set()
    groups: list[list[int]] = []
    on = set(online)
    for cpu in online:
        if cpu in seen:
            continue
        text = _read(root, f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        group = [c for c in parse_cpulist(text) if c in on] if text else []
        if cpu not in group:
            group = next((g for g in by_core.values() if cpu in g), [cpu])
        group = [c for c in sorted(group) if c not in seen]
        seen.update(group)
        groups.append(group)
    return groups


# CPU features that matter to CPU inference kernels (vLLM's CPU backend uses
# AVX-512/AMX when present; fp8 KV cache on CPU needs one of them).
_INTERESTING_FLAGS = {
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
}


def read_numa(root: Path, online_cpus: list[int]) -> list[NUMANode]:
    ids = parse_cpulist(_read(root, "sys/devices/system/node/online"))
    nodes: list[NUMANode] = []
    for nid in ids:
        base = f"sys/devices/system/node/node{nid}"
        mem = parse_meminfo(_read(root, f"{base}/meminfo"))
        nodes.append(
            NUMANode(
                id=nid,
                cpus=parse_cpulist(_read(root, f"{base}/cpulist")),
                memory_total=mem.get("MemTotal"),
                memory_free=mem.get("MemFree"),
            )
        )
    if not nodes:
        # No node/ directory (some containers): the host is one node.
        meminfo = parse_meminfo(_read(root, "proc/meminfo"))
        nodes.append(
            NUMANode(0, online_cpus, meminfo.get("MemTotal"), meminfo.get("MemFree"))
        )
    return nodes


def read_memory(root: Path) -> MemoryFacts:
    m = parse_meminfo(_read(root, "proc/meminfo"))
    return MemoryFacts(
        total=m.get("MemTotal", 0),
        available=m.get("MemAvailable", m.get("MemFree", 0)),
        hugepages_total=m.get("HugePages_Total", 0),
        hugepage_size=m.get("Hugepagesize", 0),
    )


def read_thp(root: Path) -> THPFacts:
    base = "sys/kernel/mm/transparent_hugepage"
    return THPFacts(
        enabled=parse_bracketed(_read(root, f"{base}/enabled")),
        defrag=parse_bracketed(_read(root, f"{base}/defrag")),
    )
