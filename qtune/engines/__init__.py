"""Engine adapters by name."""

from __future__ import annotations

from qtune.engines.base import Engine
from qtune.engines.vllm import VLLM
from qtune.errors import InputError

ENGINES: dict[str, Engine] = {"vllm": VLLM()}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(
            f"unknown engine {name!r}",
            hint=f"available: {', '.join(sorted(ENGINES))} (TGI and SGLang adapters "
            "are not written yet)",
        ) from None
