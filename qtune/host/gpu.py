"""GPU facts through NVML (``nvidia-ml-py``, imported as ``pynvml``).

No NVIDIA driver is a normal state (CPU hosts, laptops): ``read_gpus`` then
returns an empty list and a note, never raises.  The NVML module is passed in
so tests can replay answers captured on a real H200 host
(``tests/fixtures/hosts/h200/nvml.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    uuid: str
    memory_total: int
    memory_free: int
    compute_capability: str
    pci_bus_id: str
    numa_node: int | None
    local_cpus: list[int]
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlink_peers: list[int] = field(default_factory=list)
    nvlink_active_links: int = 0
    mig_enabled: bool = False
    persistence_mode: bool | None = None


@dataclass(frozen=True)
class GPUReport:
    gpus: list[GPU]
    driver_version: str | None
    cuda_version: str | None
    note: str | None


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVML raises NVMLError_NotSupported on many fields
        return None


def _sys_numa(root: Path, bus_id: str) -> tuple[int | None, list[int]]:
    """NUMA node and local CPUs of a PCI device from sysfs (NVML's bus id is
    upper-case with an 8-digit domain; sysfs uses 4 lower-case digits)."""
    from qtune.host.sysfs import parse_cpulist

    bdf = bus_id.lower()
    if len(bdf.split(":")[0]) == 8:
        bdf = bdf[4:]
    base = root / "sys/bus/pci/devices" / bdf
    try:
        node = int((base / "numa_node").read_text().strip())
    except (OSError, ValueError):
        node = None
    try:
        cpus = parse_cpulist((base / "local_cpulist").read_text())
    except OSError:
        cpus = []
    # -1 means the platform did not say (single-node machines, many VMs).
    return (node if node is not None and node >= 0 else None), cpus


def read_gpus(nvml: Any = None, root: Path = Path("/")) -> GPUReport:
    if nvml is None:
        try:
            # [no-redef]: the module takes the place of the `nvml` argument (tests pass a fake).
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return GPUReport([], None, None, "nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return GPUReport([], None, None, f"no NVIDIA driver found ({exc})")
    try:
        driver = _s(nvml.nvmlSystemGetDriverVersion())
        cuda_raw = _try(nvml.nvmlSystemGetCudaDriverVersion_v2)
        cuda = f"{cuda_raw // 1000}.{(cuda_raw % 1000) // 10}" if cuda_raw else None
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = [_one_gpu(nvml, i, h, handles, root) for i, h in enumerate(handles)]
        return GPUReport(gpus, driver, cuda, None)
    except Exception as exc:  # GpuIsLost, NoPermission, ...: report, never crash
        return GPUReport([], None, None, f"NVML error: {type(exc).__name__}: {exc}")
    finally:
        _try(nvml.nvmlShutdown)


def _one_gpu(nvml: Any, index: int, h: Any, handles: list[Any], root: Path) -> GPU:
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    cc = _try(nvml.nvmlDeviceGetCudaComputeCapability, h)
    pci = nvml.nvmlDeviceGetPciInfo(h)
    bus_id = _s(getattr(pci, "busId", "") or getattr(pci, "busIdLegacy", ""))
    numa, local = _sys_numa(root, bus_id) if bus_id else (None, [])
    if numa is None:
        # NVML ≥ 12 reports the NUMA node itself; sysfs wins when present.
        n = _try(nvml.nvmlDeviceGetNumaNodeId, h)
        numa = n if isinstance(n, int) and n >= 0 else None
    active_links = 0
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    for link in range(max_links):
        state = _try(nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        active_links += int(bool(state))
    peers: list[int] = []
    if active_links:
        nvlink_idx = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
        ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        for j, other in enumerate(handles):
            if j != index and _try(nvml.nvmlDeviceGetP2PStatus, h, other, nvlink_idx) == ok:
                peers.append(j)
    mig = _try(nvml.nvmlDeviceGetMigMode, h)
    persist = _try(nvml.nvmlDeviceGetPersistenceMode, h)
    return GPU(
        index=index,
        name=_s(nvml.nvmlDeviceGetName(h)),
        uuid=_s(nvml.nvmlDeviceGetUUID(h)),
        memory_total=int(mem.total),
        memory_free=int(mem.free),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else "unknown",
        pci_bus_id=bus_id,
        numa_node=numa,
        local_cpus=local,
        pcie_gen=_try(nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        pcie_width=_try(nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        pcie_gen_max=_try(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        pcie_width_max=_try(nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        nvlink_peers=peers,
        nvlink_active_links=active_links,
        mig_enabled=bool(mig[0]) if isinstance(mig, (list, tuple)) and mig else False,
        persistence_mode=None if persist is None else bool(persist),
    )


def record_nvml(nvml: Any = None) -> dict[str, Any]:
    """Raw NVML answers, as JSON-able data, for fixtures and bug reports.
    ``tests/fakes/nvml.py`` answers the same calls from this record."""
    if nvml is None:
        try:
            # [no-redef]: the module takes the place of the `nvml` argument (tests pass a fake).
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return {"error": "nvidia-ml-py is not installed"}
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return {"error": str(exc)}

    def val(fn: Any, *args: Any) -> Any:
        try:
            v = fn(*args)
        except Exception as exc:
            return {"nvml_error": type(exc).__name__}
        if isinstance(v, bytes):
            return v.decode()
        if hasattr(v, "_fields_"):
            return {f[0]: val(lambda f=f: getattr(v, f[0])) for f in v._fields_}
        if isinstance(v, (list, tuple)):
            return list(v)
        return v

    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
        nvlink_idx = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
        devices = []
        for h in handles:
            devices.append({
                "name": val(nvml.nvmlDeviceGetName, h),
                "uuid": val(nvml.nvmlDeviceGetUUID, h),
                "memory": val(nvml.nvmlDeviceGetMemoryInfo, h),
                "cuda_compute_capability": val(nvml.nvmlDeviceGetCudaComputeCapability, h),
                "pci": val(nvml.nvmlDeviceGetPciInfo, h),
                "numa_node_id": val(getattr(nvml, "nvmlDeviceGetNumaNodeId", None) or
                                    (lambda h: None), h),
                "pcie_gen": val(nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "pcie_width": val(nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                "pcie_gen_max": val(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                "pcie_width_max": val(nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                "nvlink_state": [val(nvml.nvmlDeviceGetNvLinkState, h, i)
                                 for i in range(max_links)],
                "p2p_nvlink": [val(nvml.nvmlDeviceGetP2PStatus, h, o, nvlink_idx)
                               if o is not h else None for o in handles],
                "mig_mode": val(nvml.nvmlDeviceGetMigMode, h),
                "persistence_mode": val(nvml.nvmlDeviceGetPersistenceMode, h),
            })
        return {
            "driver_version": val(nvml.nvmlSystemGetDriverVersion),
            "cuda_driver_version": val(nvml.nvmlSystemGetCudaDriverVersion_v2),
            "devices": devices,
        }
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
