"""Container deploy formats (Docker Compose, Kubernetes) for a profile.

Both start the same command the profile was tuned with (``python3 -m
<module> <engine args>``) inside the engine's published image, so the
image's own entrypoint (``vllm serve`` in recent vLLM images) does not
matter.  What has to change between the host and a container:

- the model and tokenizer folders are host paths: they are mounted read-only
  and the arguments rewritten to the container paths (a Hugging Face cache
  snapshot is mounted with its whole cache, since snapshots are symlinks into
  ``blobs/``);
- ``--host`` becomes 0.0.0.0 (the port is published or fronted by a Service);
- ``PYTHONPATH`` names the host's install: dropped, the image has its own.

Secrets are never written: the Kubernetes manifest reads ``HF_TOKEN`` from an
optional Secret; for Compose the token comes from the deploying shell.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import yaml

from qtune.emit.common import start_timeout, summary_lines
from qtune.errors import InputError
from qtune.profile import Profile

# Published images per engine build; the tag pins the version the profile
# was tuned on (never :latest).  --image overrides.
_IMAGES = {
    ("vllm", "cuda"): "vllm/vllm-openai:v{version}",
    ("vllm", "cpu"): "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}",
}
_HOST_ONLY_ENV = {"PYTHONPATH"}
_CACHE_IN_IMAGE = "/root/.cache/huggingface"


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


class _Dumper(yaml.SafeDumper):
    """No &id001 anchors for repeated dicts: deploy files are read by people."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def dump(header: list[str], docs: list[dict]) -> str:
    head = "".join(f"# {line}\n" for line in header)
    return head + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)


def dns_name(text: str) -> str:
    """A DNS-1123 label (Kubernetes names, Compose service names)."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].rstrip("-")
    return s or "qtune"


def gpus_used(profile: Profile) -> int:
    if profile.engine.build != "cuda":
        return 0
    n = 1
    for k in ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size"):
        n *= int(profile.params.get(k, 1) or 1)
    return n


def _mount_for(path: str, role: str, taken: dict[str, Mount]) -> tuple[Mount, str]:
    """The mount that makes host ``path`` visible, and its container path."""
    p = PurePosixPath(path)
    parts = p.parts
    if "hub" in parts and any(x.startswith("models--") for x in parts):
        i = parts.index("hub")
        root = str(PurePosixPath(*parts[:i]))
        m = Mount(root, _CACHE_IN_IMAGE, "hf-cache")
        return m, str(PurePosixPath(_CACHE_IN_IMAGE, *parts[i:]))
    dest = f"/models/{p.name}" if role == "model" else f"/models/tokenizer-{p.name}"
    m = Mount(str(p), dest, dns_name(f"{role}-{p.name}"))
    if m.name in taken and taken[m.name].host != m.host:
        m = Mount(str(p), dest + "-2", m.name + "-2")
    return m, dest


def container_view(profile: Profile, image: str | None = None) -> Container:
    argv = list(profile.argv)
    if len(argv) < 3 or argv[1] != "-m":
        raise InputError(
            f"profile {profile.name}: its command is not `python -m <module>`; "
            "container formats re-run that module in the engine's image",
            hint="use --format systemd for this profile",
        )
    if image is None:
        pattern = _IMAGES.get((profile.engine.name, profile.engine.build))
        if pattern is None:
            raise InputError(
                f"no published image known for {profile.engine.name} "
                f"({profile.engine.build})",
                hint="name one with --image REPO:TAG",
            )
        image = pattern.format(version=profile.engine.version.split("+")[0])
    mounts: dict[str, Mount] = {}
    args: list[str] = []
    port = 8000
    rest = argv[3:]
    i = 0
    while i < len(rest):
        a = rest[i]
        val = rest[i + 1] if i + 1 < len(rest) else None
        if a == "--host" and val is not None:
            args += [a, "0.0.0.0"]
            i += 2
            continue
        if a == "--port" and val is not None:
            port = int(val)
        if a in ("--model", "--tokenizer") and val is not None and val.startswith("/"):
            m, dest = _mount_for(val, a[2:], mounts)
            mounts.setdefault(m.name, m)
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
        command=["python3", "-m", argv[2]],
        args=args,
        env=env,
        port=port,
        gpus=gpus_used(profile),
        mounts=list(mounts.values()),
        cpus=place.get("cpus") if place.get("numa_node") is not None else None,
        start_timeout_s=start_timeout(profile),
        header=header,
    )


def shm_gib(c: Container) -> int:
    """/dev/shm for the pod: PyTorch passes tensors between the API server and
    engine processes (and TP ranks) through it; vLLM's Kubernetes guide uses
    2Gi for one GPU, so 2Gi per GPU, 2Gi at least."""
    return 2 * max(1, c.gpus)


def probe_failures(c: Container, period_s: int) -> int:
    return max(1, math.ceil(c.start_timeout_s / period_s))
