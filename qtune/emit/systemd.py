"""systemd service unit for a profile.

Escaping follows systemd.service(5) and systemd.exec(5):
- ExecStart words: ``%`` → ``%%`` (specifiers expand even inside quotes) and
  ``$`` → ``$$`` (environment substitution); a word with whitespace, quotes or
  backslashes is double-quoted with ``\\`` and ``"`` escaped; a lone ``;``
  separates commands, so it is written ``\\;``.
- Environment= values: ``%`` → ``%%`` only (no ``$`` expansion there).
- Description=: ``%`` → ``%%`` (specifiers expand there too).
- Comment lines: a backslash is doubled, because a line ending in an odd
  number of backslashes continues onto the next one, and older systemd
  (and tools reading units) join a comment line too: ``# NUMA: x\\`` would
  swallow the ``CPUAffinity=`` line after it.
- Newlines and other control characters cannot be represented: refused
  (the profile refuses them at load; this is the emitter's own guard).
Secrets never go in the unit: an ``EnvironmentFile=`` (mode 0600) carries
HF_TOKEN and friends.
"""

from __future__ import annotations

import re

from qtune.emit.common import one_line, start_timeout, summary_lines
from qtune.errors import InputError
from qtune.profile import Profile

_NEEDS_QUOTES = re.compile(r"[\s\"'\\]")


def _reject_control(text: str, where: str) -> None:
    # The value is not quoted back: it may be a secret.
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise InputError(
            f"{where} contains a newline or control character",
            hint="systemd unit values cannot hold control characters",
        )


def comment(text: str) -> str:
    return "# " + one_line(text).replace("\\", "\\\\")


def exec_word(word: str) -> str:
    _reject_control(word, "argument")
    w = word.replace("%", "%%").replace("$", "$$")
    if w == ";":
        return "\\;"
    if w == "" or _NEEDS_QUOTES.search(w):
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return w


def env_assignment(key: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise InputError("an environment name is not valid",
                         hint="names are letters, digits and _, not starting with a digit")
    _reject_control(value, f"Environment {key}")
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
    desc = f"LLM server {profile.model.get('id')} (qtune profile {profile.name})"
    _reject_control(desc, "Description")
    lines = [comment(line) for line in summary_lines(profile)] + [
        "[Unit]",
        "Description=" + desc.replace("%", "%%"),
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
        lines += [comment(f"NUMA: {place.get('why', '')}"),
                  f"CPUAffinity={place['cpus']}",
                  "NUMAPolicy=bind",
                  f"NUMAMask={place['numa_node']}"]
    elif place.get("why"):
        lines.append(comment(f"NUMA: {place['why']}"))
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
