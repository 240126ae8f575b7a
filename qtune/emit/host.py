"""Host settings for a profile: a POSIX shell script, run as root on the
serving host, that applies the settings ``qtune probe`` checks (THP, CPU
governor; ``qtune.host.settings``) now and writes a tmpfiles.d file that
applies them again at every boot.

The script holds no value from the profile except in comment lines (the
profile's name, model, engine and placement), so a profile cannot put a
command into it; those lines go through the same guard as every format's.
"""

from __future__ import annotations

import re

from qtune.emit.common import one_line, summary_lines
from qtune.emit.systemd import unit_name
from qtune.host.settings import SETTINGS
from qtune.profile import Profile


def _comment(text: str) -> str:
    return "# " + one_line(text)


def render(profile: Profile) -> str:
    name = unit_name(profile)
    conf = f"/etc/tmpfiles.d/{re.sub(r'[^A-Za-z0-9_.-]', '-', name)}.conf"
    lines = ["#!/bin/sh",
             *(_comment(line) for line in summary_lines(profile)),
             "# Host settings for serving; run as root on the serving host.",
             "# Applies them now, then writes " + conf + " so that",
             "# systemd-tmpfiles applies them again at every boot.",
             "set -eu"]
    place = profile.placement or {}
    if place.get("numa_node") is not None:
        lines.append(_comment(f"The unit binds to NUMA node {place['numa_node']} "
                              f"(CPUs {place.get('cpus')}): {place.get('why', '')}"))
    for s in SETTINGS:
        lines += ["", _comment(f"{s.path} = {s.value}: {s.why}"), s.now]
    lines += ["", f"cat > {conf} <<'EOF'",
              *(s.tmpfiles for s in SETTINGS), "EOF", ""]
    return "\n".join(lines)
