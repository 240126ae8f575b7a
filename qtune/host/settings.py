"""Host settings a serving host should have, as the exact commands that set
them: now (a write to sysfs) and across reboots (a systemd-tmpfiles line,
which writes the same value at boot; see tmpfiles.d(5), type ``w``).

The probe's findings and ``qtune emit --format host`` both take their
commands from here, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostSetting", "THP_ENABLED", "THP_DEFRAG", "GOVERNOR", "SETTINGS"]


@dataclass(frozen=True)
class HostSetting:
    path: str  # absolute sysfs path; a glob matches several files
    value: str
    why: str

    @property
    def now(self) -> str:
        """A command that writes the value at once (as root)."""
        if "*" in self.path:
            # Hosts without the file (VMs often lack cpufreq) skip it.
            return (f"for f in {self.path}; do if [ -w \"$f\" ]; then "
                    f"echo {self.value} > \"$f\"; fi; done")
        return f"echo {self.value} > {self.path}"

    @property
    def tmpfiles(self) -> str:
        """The tmpfiles.d line that writes it at every boot."""
        return f"w {self.path} - - - - {self.value}"

    def commands(self, conf: str = "/etc/tmpfiles.d/qtune-host.conf") -> list[str]:
        return [self.now, f"echo '{self.tmpfiles}' >> {conf}"]


_THP = "/sys/kernel/mm/transparent_hugepage"
THP_ENABLED = HostSetting(
    f"{_THP}/enabled", "madvise",
    "huge pages where PyTorch asks for them (large tensors: fewer TLB misses), "
    "not for every process")
THP_DEFRAG = HostSetting(
    f"{_THP}/defrag", "defer+madvise",
    "no synchronous compaction in a page fault (a latency spike), except in "
    "regions that asked for huge pages")
GOVERNOR = HostSetting(
    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor", "performance",
    "cores at full clock: a governor that ramps up on load adds latency to "
    "each engine step")
SETTINGS = (THP_ENABLED, THP_DEFRAG, GOVERNOR)
