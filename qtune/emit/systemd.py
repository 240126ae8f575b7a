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
from qtune.host.cpubind import bind_cpus
from qtune.host.sysfs import format_cpulist, parse_cpulist
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
        cpus, node = _placement_values(place)
        lines += [comment(f"NUMA: {place.get('why', '')}"),
                  *_thread_binding(profile, cpus),
                  f"CPUAffinity={cpus}",
                  "NUMAPolicy=bind",
                  f"NUMAMask={node}"]
    elif place.get("why"):
        lines.append(comment(f"NUMA: {place['why']}"))
        lines += _thread_binding(profile, None)
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _placement_values(place: dict[str, object]) -> tuple[str, int]:
    """CPUAffinity= and NUMAMask= values, checked here too: the profile
    checks them at load, and these lines are the unit's own guard."""
    cpus, node = place.get("cpus"), place.get("numa_node")
    if not isinstance(cpus, str) or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cpus):
        raise InputError("placement.cpus is not a CPU list",
                         hint="a list like 0-31,64-95, as qtune probe writes it")
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise InputError("placement.numa_node is not a node number",
                         hint="a NUMA node id (0, 1, ...), as qtune probe writes it")
    return cpus, node


def _thread_binding(profile: Profile, cpus: str | None) -> list[str]:
    """Comment lines on the CPU build's thread binding, and the check that
    an explicit one lies inside the unit's CPUAffinity= (vLLM cannot pin a
    thread to a CPU its cgroup may not use: the worker would fail at start)."""
    if profile.engine.build != "cpu":
        return []
    bind = profile.env.get(_BIND, "auto")
    try:
        lists = bind_cpus(bind)
    except ValueError:
        raise InputError(f"env {_BIND} is neither auto, nobind nor CPU lists",
                         hint="lists of CPUs per rank, like 0-31|32-63") from None
    if lists is None:
        what = {"auto": "vLLM pins one thread per core of each rank's node itself",
                "nobind": "vLLM leaves the threads unpinned"}[bind]
    else:
        what = f"threads pinned to CPUs {bind} (one list per rank)"
        if cpus is not None:
            stray = sorted({c for cl in lists for c in cl} - set(parse_cpulist(cpus)))
            if stray:
                raise InputError(
                    f"env {_BIND} names CPUs outside the unit's CPUAffinity "
                    f"({format_cpulist(stray)})",
                    hint="the profile's placement and thread binding disagree: "
                         "tune again on this host")
    return [comment(f"threads: {_BIND}={bind}: {what}")]
