"""Emitters: a profile in, deploy text out.  Each reads only the profile."""

from __future__ import annotations

from collections.abc import Callable

from qtune.emit import compose, grafana, host, kubernetes, prometheus
from qtune.emit.systemd import render as render_systemd
from qtune.errors import InputError
from qtune.profile import Profile

EMITTERS: dict[str, Callable[[Profile], str]] = {
    "systemd": render_systemd, "prometheus-rules": prometheus.render,
    "grafana": grafana.render, "host": host.render}
# Formats that run the engine's published image (--image overrides it).
CONTAINER_EMITTERS: dict[str, Callable[[Profile, str | None], str]] = {
    "compose": compose.render,
    "kubernetes": kubernetes.render,
}


def emit(profile: Profile, fmt: str, image: str | None = None,
         autoscale: str | None = None, max_replicas: int = 4,
         prometheus_url: str | None = None, user: str | None = None,
         allow_tmp: bool = False) -> str:
    if (user is not None or allow_tmp) and fmt != "systemd":
        raise InputError(f"--user/--allow-tmp: the {fmt} format sets no host user or /tmp",
                         hint="--user and --allow-tmp are for --format systemd")
    if autoscale is not None and fmt != "kubernetes":
        raise InputError(f"--autoscale: the {fmt} format has no autoscaler",
                         hint="--autoscale is for --format kubernetes")
    if prometheus_url is not None and autoscale != "keda":
        raise InputError("--prometheus-url: only KEDA's trigger asks Prometheus",
                         hint="use it with --format kubernetes --autoscale keda")
    if fmt == "systemd":
        if image is not None:
            raise InputError("--image: the systemd format runs the profile's own command",
                             hint="--image is for compose and kubernetes")
        return render_systemd(profile, user, allow_tmp)
    if fmt == "kubernetes":
        return kubernetes.render(profile, image, autoscale, max_replicas, prometheus_url)
    if fmt in CONTAINER_EMITTERS:
        return CONTAINER_EMITTERS[fmt](profile, image)
    if fmt not in EMITTERS:
        raise InputError(
            f"--format: unknown format {fmt!r}",
            hint="available: " + ", ".join(sorted({*EMITTERS, *CONTAINER_EMITTERS})),
        )
    if image is not None:
        raise InputError(f"--image: the {fmt} format runs the profile's own command",
                         hint="--image is for " + " and ".join(sorted(CONTAINER_EMITTERS)))
    return EMITTERS[fmt](profile)
