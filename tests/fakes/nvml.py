"""pynvml stand-ins: ``NoNVML`` (no driver), and ``ReplayNVML``, which answers
pynvml calls from a record made by ``qtune.host.gpu.record_nvml``.

A record (``tests/fixtures/hosts/<host>/nvml.json``) holds the raw NVML
answers of a real host; ``ReplayNVML(record)`` plays them back so
``read_gpus`` and ``probe`` run in CI without a GPU.  Handles are device
indices.  Entries recorded as ``{"nvml_error": "NVMLError_NotSupported"}``
raise an exception of that class name (a subclass of ``NVMLError``), as the
real module does; a record with a top-level ``"error"`` (no driver) makes
``nvmlInit`` raise.  The replay is faithful enough that
``record_nvml(ReplayNVML(record)) == record``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class NVMLError(Exception):
    """Base of the replayed errors, like ``pynvml.NVMLError``."""


_ERRORS: dict[str, type[NVMLError]] = {}


def nvml_error(name: str) -> NVMLError:
    """An instance of the ``NVMLError`` subclass called ``name``
    (``NVMLError_NotSupported``, ...), so ``type(exc).__name__`` matches the
    record just as it did on the real host."""
    cls = _ERRORS.get(name)
    if cls is None:
        cls = _ERRORS[name] = type(name, (NVMLError,), {})
    return cls(name)


class Struct:
    """A ctypes-structure look-alike: fields as attributes, and ``_fields_``
    so ``record_nvml`` serialises it the way it serialises pynvml's."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields_ = [(k, None) for k in fields]
        for k, v in fields.items():
            setattr(self, k, v)


def _answer(v: Any) -> Any:
    if isinstance(v, dict) and "nvml_error" in v:
        raise nvml_error(v["nvml_error"])
    return v


class ReplayNVML:
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.devices: list[dict[str, Any]] = record.get("devices", [])
        links = [len(d.get("nvlink_state", [])) for d in self.devices]
        # pynvml 13 says 36; the record holds one answer per link it asked.
        self.NVML_NVLINK_MAX_LINKS = max(links, default=0) or 18
        self.initialized = 0  # nvmlInit calls minus nvmlShutdown calls

    @classmethod
    def from_file(cls, path: Path) -> ReplayNVML:
        return cls(json.loads(Path(path).read_text()))

    # -- library ---------------------------------------------------------
    def nvmlInit(self) -> None:
        if "error" in self.record:
            raise nvml_error(self.record["error"])
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return _answer(self.record["driver_version"])

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return _answer(self.record["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise nvml_error("NVMLError_InvalidArgument")
        return index

    # -- per device ------------------------------------------------------
    def _get(self, h: int, key: str) -> Any:
        if not isinstance(h, int) or not 0 <= h < len(self.devices):
            raise nvml_error("NVMLError_InvalidArgument")
        return _answer(self.devices[h][key])

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._get(h, "uuid")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Struct:
        return Struct(self._get(h, "memory"))

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        major, minor = self._get(h, "cuda_compute_capability")
        return major, minor

    def nvmlDeviceGetPciInfo(self, h: int) -> Struct:
        return Struct(self._get(h, "pci"))

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int | None:
        return self._get(h, "numa_node_id")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "pcie_gen_max")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "pcie_width_max")

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        states = self._get(h, "nvlink_state")
        if not 0 <= link < len(states):
            raise nvml_error("NVMLError_InvalidArgument")
        return _answer(states[link])

    def nvmlDeviceGetP2PStatus(self, h: int, other: int, caps_index: int) -> int:
        if caps_index != self.NVML_P2P_CAPS_INDEX_NVLINK:
            # Only the NVLink capability was recorded.
            raise nvml_error("NVMLError_NotSupported")
        row = self._get(h, "p2p_nvlink")
        known = isinstance(other, int) and 0 <= other < len(row)
        if not known or row[other] is None:
            raise nvml_error("NVMLError_InvalidArgument")
        return _answer(row[other])

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return list(self._get(h, "mig_mode"))

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._get(h, "persistence_mode")


class NoNVML:
    def nvmlInit(self) -> None:
        raise OSError("NVML Shared Library Not Found")
