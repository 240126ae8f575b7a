"""Docker Compose service for a profile (see ``container`` for what changes
between the host and the container).

Compose interpolates ``$`` in every value, so each is written ``$$``.  GPUs
are reserved by count (``capabilities: [gpu]`` is required by Compose).

Hardened as the Kubernetes manifest, with the same figures
(``container.sizing``, ``container.shm_gib``):

- ``shm_size`` gives PyTorch the shared memory its processes pass tensors
  through (Docker's default /dev/shm is 64 MB), instead of ``ipc: host``,
  which would share the host's IPC namespace;
- memory and CPU reservations (what the server needs at least) and limits
  (its share of the tuning host);
- the non-root user of the Kubernetes manifest (uid 10001), no privilege
  escalation, every capability dropped, a read-only root filesystem.  The
  engine writes only /tmp and its home (the compile and kernel caches, the
  Hugging Face cache below ``HF_HOME``): both are tmpfs owned by that user,
  as the manifest's emptyDirs, the home moved from /root (which the user
  cannot enter) to ``HOME``.  Compose has no fsGroup: a named volume for a
  cache would be created root-owned, unwritable by the user, so the caches
  live in the home's tmpfs and are rebuilt at a restart, as in a new pod.
"""

from __future__ import annotations

from typing import Any

from qtune.emit.container import (
    HOME,
    UID,
    container_view,
    dump,
    nonroot_env,
    shm_gib,
    sizing,
)
from qtune.profile import Profile


def _esc(value: str) -> str:
    return value.replace("$", "$$")


def render(profile: Profile, image: str | None = None) -> str:
    c = container_view(profile, image, home=HOME)
    s = sizing(profile, c)
    svc: dict[str, Any] = {
        "image": _esc(c.image),  # --image is text from the command line
        "entrypoint": [_esc(a) for a in c.command],
        "command": [_esc(a) for a in c.args],
    }
    # HF_TOKEN with no value: passed through from the shell that runs
    # compose when set there, and never written here.
    svc["environment"] = {**nonroot_env(), **{k: _esc(v) for k, v in c.env.items()},
                          "HF_TOKEN": None}
    svc["user"] = f"{UID}:{UID}"
    svc["read_only"] = True
    # tmpfs options go to the kernel's mount: owned by the user, who alone
    # enters its home; /tmp as any /tmp (sticky, world-writable).
    svc["tmpfs"] = ["/tmp:mode=1777", f"{HOME}:uid={UID},gid={UID},mode=0700"]
    svc["security_opt"] = ["no-new-privileges:true"]
    svc["cap_drop"] = ["ALL"]
    svc["shm_size"] = f"{shm_gib(c)}gb"
    # Loopback, as the tuned server and the systemd unit: expose it on
    # purpose (a proxy, or another address here).
    svc["ports"] = [f"127.0.0.1:{c.port}:{c.port}"]
    if c.mounts:
        # The long form: a path with ':' breaks the short one.
        svc["volumes"] = [
            {"type": "bind", "source": _esc(m.host), "target": _esc(m.container),
             "read_only": True} for m in c.mounts]
    if c.cpus:
        svc["cpuset"] = c.cpus
    reservations: dict[str, Any] = {"cpus": str(s.cpu_req), "memory": f"{s.mem_req}gb"}
    if c.gpus:
        reservations["devices"] = [
            {"driver": "nvidia", "count": c.gpus, "capabilities": ["gpu"]}]
    svc["deploy"] = {"resources": {
        "limits": {"cpus": str(s.cpu_lim), "memory": f"{s.mem_lim}gb"},
        "reservations": reservations}}
    svc["healthcheck"] = {
        # The image has python3 but maybe not curl.
        "test": ["CMD", "python3", "-c", "import urllib.request; urllib.request."
                 f"urlopen('http://localhost:{c.port}/health', timeout=5)"],
        "interval": "30s", "timeout": "10s", "retries": 3,
        "start_period": f"{c.start_timeout_s}s",
    }
    svc["restart"] = "unless-stopped"
    # as the manifest's terminationGracePeriodSeconds: in-flight requests end
    svc["stop_grace_period"] = "2m"
    doc: dict[str, Any] = {"services": {c.name: svc}}
    return dump(c.header + [
        s.header,
        f"runs as uid {UID} (not root): the model's host folder must be readable by it",
        "caches (compiled kernels) live in a tmpfs: rebuilt after a restart",
        "secrets: HF_TOKEN comes from the shell that runs compose, never from this file"],
        [doc])
