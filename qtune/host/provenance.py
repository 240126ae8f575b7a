"""Is this the kind of host a profile was tuned on?  ``qtune emit`` and
``qtune check`` warn when not: a profile's figures (and often its flags: a
memory share, a parallel layout) hold for the GPUs, driver and NUMA layout
they were measured on, not for another host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (fingerprint key, what to call it); the profile's ``host`` is a fingerprint
# (HostFacts.fingerprint) written when it was tuned.
_FACTS = (
    ("gpus", "GPUs"),
    ("driver", "GPU driver"),
    ("numa_nodes", "NUMA nodes"),
    ("sockets", "CPU sockets"),
    ("cpu_model", "CPU model"),
    ("physical_cores", "physical cores"),
)


def _show(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, list):
        return f"{len(v)} x {v[0]}" if v and len(set(v)) == 1 else (
            ", ".join(map(str, v)) or "none")
    return str(v)


def host_differences(tuned: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """One line per fact that differs; a fact the profile did not record is
    not compared."""
    out = []
    for key, what in _FACTS:
        if key in tuned and key in here and tuned[key] != here[key]:
            out.append(f"{what}: tuned on {_show(tuned[key])}, this host has "
                       f"{_show(here[key])}")
    return out


def engine_difference(tuned_version: str, here_version: str | None, name: str) -> str | None:
    if here_version is None:
        return f"{name} is not installed here (tuned on {tuned_version})"
    if here_version.split("+")[0] != tuned_version.split("+")[0]:
        return f"{name}: tuned on {tuned_version}, this host has {here_version}"
    return None
