"""Engine adapters by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qtune.engines.base import Engine, MetricNames
from qtune.engines.sglang import SGLang
from qtune.engines.tgi import TGI
from qtune.engines.vllm import VLLM
from qtune.errors import InputError

ENGINES: dict[str, Engine] = {"vllm": VLLM(), "sglang": SGLang(), "tgi": TGI()}
DEFAULT_ENGINE = "vllm"


def gpus_used(engine: Engine | None, params: Mapping[str, Any]) -> int:
    """GPUs a config occupies: the adapter's ``gpus_used``, 1 for an engine
    qtune has no adapter for (a profile from elsewhere)."""
    return engine.gpus_used(params) if engine is not None else 1


def any_engine_metric_names() -> MetricNames | None:
    """Metric names for an endpoint qtune did not launch (``qtune bench``):
    the default engine's."""
    return ENGINES[DEFAULT_ENGINE].metric_names()


def any_engine_cache_reset_paths() -> tuple[str, ...]:
    """Prefix-cache reset paths for an endpoint qtune did not launch: every
    adapter's, in registry order, each once."""
    return tuple(dict.fromkeys(p for e in ENGINES.values() for p in e.cache_reset_paths()))


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(
            f"unknown engine {name!r}",
            hint=f"available: {', '.join(sorted(ENGINES))}",
        ) from None
