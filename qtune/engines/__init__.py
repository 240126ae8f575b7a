"""Engine adapters by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qtune.engines.base import Engine
from qtune.engines.vllm import VLLM
from qtune.errors import InputError

ENGINES: dict[str, Engine] = {"vllm": VLLM()}


def gpus_used(engine: Engine | None, params: Mapping[str, Any]) -> int:
    """GPUs a config occupies: the adapter's ``gpus_used`` (optional in the
    protocol), 1 when it has none."""
    used = getattr(engine, "gpus_used", None)
    return used(params) if used else 1


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(
            f"unknown engine {name!r}",
            hint=f"available: {', '.join(sorted(ENGINES))} (TGI and SGLang adapters "
            "are not written yet)",
        ) from None
