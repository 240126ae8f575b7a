"""Docker Compose service for a profile (see ``container`` for what changes
between the host and the container).

Compose interpolates ``$`` in every value, so each is written ``$$``.  GPUs
are reserved by count (``capabilities: [gpu]`` is required by Compose);
``ipc: host`` gives PyTorch the shared memory its processes pass tensors
through (Docker's default /dev/shm is 64 MB).
"""

from __future__ import annotations

from typing import Any

from qtune.emit.container import container_view, dump
from qtune.profile import Profile


def _esc(value: str) -> str:
    return value.replace("$", "$$")


def render(profile: Profile, image: str | None = None) -> str:
    c = container_view(profile, image)
    svc: dict[str, Any] = {
        "image": _esc(c.image),  # --image is text from the command line
        "entrypoint": [_esc(a) for a in c.command],
        "command": [_esc(a) for a in c.args],
    }
    # HF_TOKEN with no value: passed through from the shell that runs
    # compose when set there, and never written here.
    svc["environment"] = {**{k: _esc(v) for k, v in c.env.items()}, "HF_TOKEN": None}
    svc["ipc"] = "host"
    # Loopback, as the tuned server and the systemd unit: expose it on
    # purpose (a proxy, or another address here).
    svc["ports"] = [f"127.0.0.1:{c.port}:{c.port}"]
    # The long form: a path with ':' breaks the short one.
    svc["volumes"] = [
        {"type": "bind", "source": _esc(m.host), "target": _esc(m.container), "read_only": True}
        for m in c.mounts] + [
        # the engine's caches (compiled kernels): faster restarts
        {"type": "volume", "source": v.name, "target": v.path} for v in c.caches]
    if c.cpus:
        svc["cpuset"] = c.cpus
    if c.gpus:
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": c.gpus, "capabilities": ["gpu"]}]}}}
    svc["healthcheck"] = {
        # The image has python3 but maybe not curl.
        "test": ["CMD", "python3", "-c", "import urllib.request; urllib.request."
                 f"urlopen('http://localhost:{c.port}/health', timeout=5)"],
        "interval": "30s", "timeout": "10s", "retries": 3,
        "start_period": f"{c.start_timeout_s}s",
    }
    svc["restart"] = "unless-stopped"
    svc["stop_grace_period"] = "2m"
    doc: dict[str, Any] = {"services": {c.name: svc}}
    if c.caches:
        doc["volumes"] = {v.name: {} for v in c.caches}
    return dump(c.header + ["secrets: HF_TOKEN comes from the shell that runs compose, "
                            "never from this file"], [doc])
