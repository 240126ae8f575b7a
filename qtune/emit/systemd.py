"""systemd service unit for a profile.

Escaping follows systemd.service(5) and systemd.exec(5):
- ExecStart words: ``%`` → ``%%`` (specifiers expand even inside quotes) and
  ``$`` → ``$$`` (environment substitution); a word with whitespace, quotes or
  backslashes is double-quoted with ``\\`` and ``"`` escaped; a lone ``;``
  separates commands, so it is written ``\\;``.
- Environment= values: ``%`` → ``%%`` only (no ``$`` expansion there).
- Newlines and other control characters cannot be represented: refused.
Secrets never go in the unit: an ``EnvironmentFile=`` (mode 0600) carries
HF_TOKEN and friends.
"""

from __future__ import annotations

import re

from qtune.emit.common import start_timeout, summary_lines
from qtune.errors import InputError
from qtune.profile import Profile

_NEEDS_QUOTES = re.compile(r"[\s\"'\\]")


def _reject_control(text: str, where: str) -> None:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise InputError(
            f"{where} contains a newline or control character: {text[:40]!r}",
            hint="systemd unit values cannot hold control characters",
        )


def exec_word(word: str) -> str:
    _reject_control(word, "argument")
    w = word.replace("%", "%%").replace("$", "$$")
    if w == ";":
        return "\\;"
    if w == "" or _NEEDS_QUOTES.search(w):
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return w


def env_assignment(key: str, value: str) -> str:
    _reject_control(key + value, f"Environment {key}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise InputError(f"environment name {key!r} is not valid",
                         hint="names are letters, digits and _, not starting with a digit")
    kv = f"{key}={value}".replace("%", "%%")
    if _NEEDS_QUOTES.search(kv):
        kv = '"' + kv.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return kv


def unit_name(profile: Profile) -> str:
    base = re.sub(r"[^A-Za-z0-9:_.-]+", "-", profile.name)[:80]
    return base if base.startswith("qtune") else "qtune-" + base


def render(profile: Profile) -> str:
    name = unit_name(profile)
    timeout_start = start_timeout(profile)
    argv = [exec_word(a) for a in profile.argv]
    exec_lines = []
    line = "ExecStart=" + argv[0]
    for word in argv[1:]:
        if word.startswith("--"):
            exec_lines.append(line + " \\")
            line = "    " + word
        else:
            line += " " + word
    exec_lines.append(line)
    gpu = profile.engine.build == "cuda"
    lines = [f"# {line}" for line in summary_lines(profile)] + [
        "[Unit]",
        f"Description=LLM server {profile.model.get('id')} (qtune profile {profile.name})",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        # vLLM only sends sd_notify READY in releases newer than those qtune
        # has verified; exec reports a missing binary and is safe everywhere.
        "Type=exec",
        # Secrets (HF_TOKEN, ...) live here, root-only, never in the unit.
        f"EnvironmentFile=-/etc/qtune/{name}.env",
    ]
    for k, v in sorted(profile.env.items()):
        lines.append("Environment=" + env_assignment(k, v))
    lines += exec_lines
    lines += [
        f"TimeoutStartSec={timeout_start}",
        "TimeoutStopSec=120",
        "KillMode=control-group",
        "Restart=on-failure",
        "RestartSec=15",
        "LimitNOFILE=65536",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
    ]
    if gpu:
        # PrivateDevices would hide /dev/nvidia*; list them instead.
        lines += ["DevicePolicy=closed", "DeviceAllow=char-nvidia* rw"]
    place = profile.placement or {}
    if place.get("numa_node") is not None:
        # Threads and memory on the node next to the GPU (or one node for
        # CPU serving): remote memory costs bandwidth on every step.
        lines += [f"# NUMA: {place.get('why', '')}",
                  f"CPUAffinity={place['cpus']}",
                  "NUMAPolicy=bind",
                  f"NUMAMask={place['numa_node']}"]
    elif place.get("why"):
        lines.append(f"# NUMA: {place['why']}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
