"""Engine adapters by name."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qtune import host
from qtune.engines.base import Engine, LaunchSpec, MetricNames, SpaceContext
from qtune.engines.sglang import SGLang
from qtune.engines.tgi import TGI
from qtune.engines.transformers import Transformers
from qtune.engines.vllm import VLLM
from qtune.errors import InputError
from qtune.host import HostFacts, installed
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.model import cache_dir

ENGINES: dict[str, Engine] = {"vllm": VLLM(), "sglang": SGLang(), "tgi": TGI(),
                              "transformers": Transformers()}
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


def find_engines(python: str) -> InstalledEngines:
    """Every adapter's engine as installed for ``python`` (or on PATH)."""
    return installed.find_engines(python, tuple(ENGINES.values()))


def probe_host(**kw: Any) -> HostFacts:
    """``qtune.host.probe`` with every adapter: the installed engines and
    each engine's own findings (the host knows no engine by name)."""
    return host.probe(engines=tuple(ENGINES.values()), **kw)


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError(
            f"unknown engine {name!r}",
            hint=f"available: {', '.join(sorted(ENGINES))}",
        ) from None


def compile_cache_root(install: EngineInstall) -> Path:
    """The folder qtune keeps an engine's compile caches in on this host, one
    per engine version and build: shared by every start of a study (trials,
    confirmation, verify) and by later studies, never by another version."""
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", f"{install.name}-{install.version}-{install.build}")
    return cache_dir() / "compile" / name


def on_this_host(engine: Engine, spec: LaunchSpec, install: EngineInstall) -> LaunchSpec:
    """``spec`` as qtune starts it on this host: the engine's compile caches
    under ``compile_cache_root`` (``Engine.compile_cache_env``), in the
    host-only environment that never reaches a profile."""
    extra = engine.compile_cache_env(compile_cache_root(install))
    return dataclasses.replace(spec, host_env={**spec.host_env, **extra}) if extra else spec


def trial_spec(engine: Engine, params: Mapping[str, Any], ctx: SpaceContext,
               port: int) -> LaunchSpec:
    """The launch of ``params`` on a loopback port of this host, as a trial,
    a confirmation or a benchmark starts it (``on_this_host``)."""
    return on_this_host(engine, engine.launch_spec(params, ctx, host="127.0.0.1", port=port),
                        ctx.install)
