"""Emitters: a profile in, deploy text out.  Each reads only the profile."""

from __future__ import annotations

from collections.abc import Callable

from qtune.emit.systemd import render as render_systemd
from qtune.errors import InputError
from qtune.profile import Profile

EMITTERS: dict[str, Callable[[Profile], str]] = {"systemd": render_systemd}


def emit(profile: Profile, fmt: str) -> str:
    try:
        fn = EMITTERS[fmt]
    except KeyError:
        raise InputError(
            f"--format: unknown format {fmt!r}",
            hint="available: " + ", ".join(sorted(EMITTERS)),
        ) from None
    return fn(profile)
