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

What the unit runs as, and what it can see (issue 29):
- an unprivileged user: ``DynamicUser=yes`` by default, or ``User=`` when
  ``--user`` names one; on a CUDA build with the GPU groups
  (``SupplementaryGroups=video render``) and ``DeviceAllow=`` for
  ``/dev/nvidia*`` under ``DevicePolicy=closed``;
- writable caches (Hugging Face, the engine's compile caches, Triton) in
  ``CacheDirectory=`` and a home in ``StateDirectory=``: the user owns no
  other folder, and ``DynamicUser=`` makes the rest of the system read-only;
- ``PrivateTmp=yes`` gives the service an empty ``/tmp``: a path under
  ``/tmp`` or ``/var/tmp`` in ``ExecStart=`` or ``Environment=`` would not be
  found (4 of the 5 example profiles had one), so it is refused unless the
  user opts out of the private ``/tmp`` (``--allow-tmp``);
- a path the unit's user could not reach is refused unless the unit runs as
  root.  Where the path exists on this host it is judged by its permissions,
  after symlinks: every folder on the way must let the user pass and the file
  be readable (the program runnable).  A venv's ``bin/python`` is a link to
  the interpreter it was made from, often under ``/root`` (mode 0700): the
  unit then ended ``status=203/EXEC`` under a real systemd (PID 1 in a
  container, ``tests/emit/test_systemd_boot.py``) although the link itself
  lay in a readable folder.  A path that does not exist here (a profile for
  another host) is judged by name: one under ``/root`` is refused;
- the profile's warnings (random weights, lossy numerics not measured) and
  notes as comment lines at the top, as Compose and Kubernetes carry them.
"""

from __future__ import annotations

import os
import re

from qtune.emit.common import one_line, start_timeout, summary_lines
from qtune.engines import ENGINES
from qtune.errors import InputError
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


# Folders PrivateTmp=yes replaces with an empty one (systemd.exec(5)).
_PRIVATE_TMP = ("/tmp", "/var/tmp")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,30}")
# Paths that name a file in a word: the word itself, or the value of
# --flag=/path, or a colon-separated list (PYTHONPATH).
_PATHISH = re.compile(r"(?:^|[=:])(/[^:=]*)")


def _paths(word: str) -> list[str]:
    return [m.group(1) for m in _PATHISH.finditer(word)]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    import posixpath

    p = posixpath.normpath(path)
    return any(p == r or p.startswith(r + "/") for r in roots)


def _access(user: str | None) -> tuple[int, set[int]]:
    """The uid and groups whose permission bits apply to the unit's user on
    this host; (-1, {}) for a DynamicUser= (a fresh uid that owns nothing:
    only the bits for others apply) or a user this host does not know."""
    import grp
    import pwd

    if user is None:
        return -1, set()
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return -1, set()
    gids = set(os.getgrouplist(user, pw.pw_gid))
    gids |= {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return pw.pw_uid, gids


def _may(st: os.stat_result, who: tuple[int, set[int]], need: int) -> bool:
    """Whether ``who`` has every bit of ``need`` (4 read, 2 write, 1 run or
    pass) on a file with ``st``'s owner, group and mode.  ACLs are not read."""
    uid, gids = who
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid in gids:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & need == need


def _blocker(path: str, who: tuple[int, set[int]], *, run: bool) -> str | None:
    """What stops ``who`` on the way to ``path`` on this host: the first
    folder it may not pass, or the file it may not read (or run); None when
    it gets through.  What this process cannot look at itself (an emitter
    that is not root) is not judged."""
    try:
        return _walk(path, who, run=run)
    except OSError:
        return None


def _walk(path: str, who: tuple[int, set[int]], *, run: bool) -> str | None:
    """The kernel's walk, one name at a time: every folder looked up in must
    let ``who`` pass, and a link's target is walked from where it points
    (a chain of links through a closed folder is caught at the hop inside
    it; ``..`` is looked up in the folder it leaves)."""
    import stat

    def closed(folder: str, st: os.stat_result) -> str:
        return f"{folder} is mode {stat.S_IMODE(st.st_mode):04o}, owned by uid {st.st_uid}"

    todo = [c for c in path.split("/") if c not in ("", ".")]
    here, hops = "/", 0
    while todo:
        name = todo.pop(0)
        st = os.stat(here)
        if not _may(st, who, 1):
            return closed(here, st)
        if name == "..":
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, name)
        if stat.S_ISLNK(os.lstat(step).st_mode):
            hops += 1
            if hops > 40:  # the kernel's own limit (ELOOP)
                return f"{path}: more than 40 links on the way"
            target = os.readlink(step)
            todo = [c for c in target.split("/") if c not in ("", ".")] + todo
            if target.startswith("/"):
                here = "/"
            continue
        here = step
    st = os.stat(here)
    if stat.S_ISDIR(st.st_mode):
        need = 5
    elif run:
        # a binary runs with the execute bit alone; a script is read by its
        # interpreter too
        with open(here, "rb") as f:
            need = 1 if f.read(4) == b"\x7fELF" else 5
    else:
        need = 4
    if not _may(st, who, need):
        return closed(here, st)
    if stat.S_ISDIR(st.st_mode):
        # a model folder's files (weights saved with umask 077 are 0600);
        # one level: the files an engine opens by name
        with os.scandir(here) as it:
            for n, entry in enumerate(it):
                if n >= 256:
                    break
                if entry.is_file() and not _may(entry.stat(), who, 4):
                    return closed(entry.path, entry.stat())
    return None


def check_paths(profile: Profile, user: str | None, allow_tmp: bool) -> None:
    """Refuse a unit that would not find its own files under its sandbox."""
    places = [("ExecStart", w) for w in profile.argv] + [
        (f"Environment {k}", v) for k, v in sorted(profile.env.items())]
    who = None if user == "root" else _access(user)
    for n, (where, word) in enumerate(places):
        for path in _paths(word):
            real = os.path.realpath(path)
            if not allow_tmp and (_under(path, _PRIVATE_TMP) or _under(real, _PRIVATE_TMP)):
                shown = path if _under(path, _PRIVATE_TMP) else f"{path} (a link to {real})"
                raise InputError(
                    f"{where}: {shown} is under /tmp or /var/tmp, which PrivateTmp=yes "
                    "hides from the service",
                    hint="move it (a venv under /opt, a model under /srv or /var/lib), "
                         "re-run qtune search, or give --allow-tmp to drop PrivateTmp=")
            if who is None:
                continue
            runs_as = f"the unit runs as {user or 'a dynamic user'}"
            if os.path.exists(path):
                blocked = _blocker(path, who, run=n == 0)
                if blocked:
                    shown = path if real == os.path.normpath(path) else f"{path} (a link to {real})"
                    raise InputError(
                        f"{where}: {shown} is out of reach ({runs_as}): {blocked}",
                        hint="give --user an account that can read it (--user root runs "
                             "the server as root), or put it where every user can read "
                             "it (a venv under /opt, a model under /srv or /var/lib)")
            elif _under(path, ("/root",)):
                raise InputError(
                    f"{where}: {path} is under /root, which only root can read ({runs_as})",
                    hint="move it out of /root (a model under /srv or /var/lib), "
                         "or give --user root to run the server as root")


def flags_needed(profile: Profile) -> tuple[list[str], list[str]]:
    """The fewest of ``--allow-tmp`` and ``--user <this user>`` with which
    ``qtune emit --format systemd`` writes this profile's unit on this host,
    and why each is needed: the report's deploy line is a command that runs
    as pasted (the quick start's clone lies under /tmp and its venv's python
    links under /root, so the bare command was refused).  ``--user`` is
    offered only for an account emit accepts."""
    import pwd

    try:
        me: str | None = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid with no account (a container's)
        me = None
    if me is not None and (not _USER.fullmatch(me) or me == "nobody"):
        me = None
    tries: list[tuple[str | None, bool]] = [(None, False), (None, True)]
    if me is not None:
        tries += [(me, False), (me, True)]
    for user, tmp in tries:
        try:
            check_paths(profile, user, tmp)
        except InputError:
            continue
        why = []
        if tmp:
            why.append("--allow-tmp: a path lies under /tmp, which PrivateTmp= hides")
        if user:
            why.append(f"--user {user}: a path is out of a dynamic user's reach")
        return [*(["--user", user] if user else []), *(["--allow-tmp"] if tmp else [])], why
    return [], []


def render(profile: Profile, user: str | None = None, allow_tmp: bool = False) -> str:
    """The unit.  ``user``: the account it runs as (``DynamicUser=yes``
    when None); ``allow_tmp``: drop ``PrivateTmp=`` instead of refusing a
    path under /tmp."""
    if user is not None and not _USER.fullmatch(user):
        raise InputError("--user: not a user name systemd accepts",
                         hint="a POSIX user name: lower-case letters, digits, _ and -")
    if user == "nobody":
        # systemd warns "Special user nobody configured, this is not safe!":
        # every service run as nobody shares its files and processes
        raise InputError("--user nobody: systemd calls this unsafe (nobody is shared "
                         "by every service that uses it)",
                         hint="leave --user out for a DynamicUser=, or name a user of its own")
    check_paths(profile, user, allow_tmp)
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
    head = summary_lines(profile) + [f"note: {n}" for n in profile.notes]
    lines = [comment(line) for line in head] + [
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
    for k, v in sorted({**_cache_env(name), **profile.env}.items()):
        lines.append("Environment=" + env_assignment(k, v))
    lines += exec_lines
    lines += [
        f"TimeoutStartSec={timeout_start}",
        "TimeoutStopSec=120",
        "KillMode=control-group",
        "Restart=on-failure",
        "RestartSec=15",
        "LimitNOFILE=65536",
        *_identity(name, user, gpu),
        "NoNewPrivileges=yes",
        *([] if allow_tmp else ["PrivateTmp=yes"]),
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
    ]
    if gpu:
        # PrivateDevices would hide /dev/nvidia*; list them instead: the
        # driver's character devices (nvidia, nvidiactl, nvidia-uvm,
        # nvidia-caps) by their /proc/devices group, and the nodes CUDA opens.
        lines += ["DevicePolicy=closed", "DeviceAllow=char-nvidia* rw",
                  "DeviceAllow=/dev/nvidiactl rw", "DeviceAllow=/dev/nvidia-uvm rw",
                  "DeviceAllow=/dev/nvidia-uvm-tools rw"]
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


def _cache_env(name: str) -> dict[str, str]:
    """Where the caches go: the folders CacheDirectory= and StateDirectory=
    make (and hand to the unit's user).  The profile's own env wins."""
    cache, state = f"/var/cache/{name}", f"/var/lib/{name}"
    return {"HOME": state, "XDG_CACHE_HOME": cache, "HF_HOME": f"{cache}/huggingface"}


def _identity(name: str, user: str | None, gpu: bool) -> list[str]:
    lines = [f"CacheDirectory={name}", f"StateDirectory={name}"]
    if user is None:
        # An unprivileged user made at start, with a read-only system: a
        # server bug cannot write outside its cache and state folders.
        lines.insert(0, "DynamicUser=yes")
    else:
        lines.insert(0, f"User={user}")
    if gpu and user != "root":
        # Distributions give /dev/nvidia* and /dev/dri to these groups.
        lines.append("SupplementaryGroups=video render")
    return lines


def _placement_values(place: dict[str, object]) -> tuple[str, int]:
    """CPUAffinity= and NUMAMask= values, checked here too: the profile
    checks them at load, and these lines are the unit's own guard."""
    cpus, node = place.get("cpus"), place.get("numa_node")
    if not isinstance(cpus, str) or not re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", cpus):
        raise InputError("placement.cpus is not a CPU list",
                         hint="a list like 0-31,64-95, as qtune probe writes it")
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise InputError("placement.numa_node is not a node number",
                         hint="a NUMA node id (0, 1, ...), as qtune probe writes it")
    return cpus, node


def _thread_binding(profile: Profile, cpus: str | None) -> list[str]:
    """Comment lines on how the server pins its threads (the engine's
    ``cpu_binding``), and the check that the CPUs it pins lie inside the
    unit's CPUAffinity= (a thread cannot be pinned to a CPU its cgroup may
    not use: the worker would fail at start)."""
    engine = ENGINES.get(profile.engine.name)
    binding = engine.cpu_binding(profile.env, profile.engine.build) if engine else None
    if binding is None:
        return []
    if binding.cpus is not None and cpus is not None:
        stray = sorted(binding.cpus - set(parse_cpulist(cpus)))
        if stray:
            raise InputError(
                f"env {binding.setting.partition('=')[0]} names CPUs outside the unit's "
                f"CPUAffinity ({format_cpulist(stray)})",
                hint="the profile's placement and thread binding disagree: tune again on "
                     "this host")
    return [comment(f"threads: {binding.setting}: {binding.what}")]
