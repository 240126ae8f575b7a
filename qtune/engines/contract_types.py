"""The values the engine contract (``qtune.engines.base.Engine``) takes and
returns: a tunable (``Param``), what shapes the space (``SpaceContext``,
``LoadView``), why a start failed (``Failure``), and how a launch is laid
out for the deploy formats (``CacheVolume``, ``CommandWords``,
``CpuBinding``).

Apart from the contract so that ``Engine`` reads as its list of hooks, and
so that the helpers adapters share (``qtune.engines.helpers``) can build
these values without importing the contract.  Import them from
``qtune.engines.base``, which re-exports them for adapters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qtune.host import HostFacts
from qtune.host.installed import EngineInstall
from qtune.model import ModelInfo


@dataclass(frozen=True)
class Param:
    """One tunable.  ``target`` says where the value goes: a CLI flag or an
    environment variable of the server process."""

    name: str
    kind: str  # "int" | "float" | "bool" | "choice" | "str" (fixed values only)
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    target: str = "flag"  # "flag" | "env"
    help: str = ""
    # Launch only powers of two (ints): fewer distinct values, so a later
    # trial can reuse what an earlier one compiled (vLLM's compile ranges).
    pow2: bool = False
    # Searched only when a --space file names it: a dimension this host can
    # run but that measured not to pay here (the engine's help says why).
    opt_in: bool = False

    def __post_init__(self) -> None:
        if self.kind in ("int", "float") and (
            self.low is None or self.high is None or self.low > self.high
        ):
            raise ValueError(f"{self.name}: bad range {self.low}..{self.high}")
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"{self.name}: no choices")

    @property
    def bounds(self) -> tuple[float, float]:
        """``(low, high)`` of an int or float parameter, which
        ``__post_init__`` made sure are set; the type checker cannot see that."""
        if self.low is None or self.high is None:
            raise ValueError(f"{self.name}: a {self.kind} parameter has no range")
        return self.low, self.high


@dataclass(frozen=True)
class SpaceContext:
    """What an adapter may consult to shape the space: host, model, build."""

    host: HostFacts
    model: ModelInfo
    install: EngineInstall
    max_model_len: int | None = None  # explicit --max-model-len, if any
    # The installed engine's own arguments ({dest: {flag, kind, default,
    # choices}}), when they could be read; None means "use built-in facts".
    engine_args: dict[str, Any] | None = None
    # Keep the model's numerics: no lossy option (fp8 KV cache, fp8 weights)
    # in the space.
    exact: bool = False

    @property
    def effective_max_model_len(self) -> int:
        return self.max_model_len or self.model.max_context


@dataclass(frozen=True)
class LoadView:
    """What the search knows of the load when it shapes the space: the
    offered load and, once measured, the engine defaults' run summary."""

    rate: float | None
    concurrency: int | None
    shared_prefix: bool  # do prompts share prefixes (prefix caching can help)
    baseline: Mapping[str, Any] | None = None
    baseline_params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    reason: str  # oom | invalid_config | timeout | port_in_use | environment | crash
    detail: str


@dataclass
class FixedArgs:
    """Flags and env qtune sets on every trial (not tuned)."""

    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheVolume:
    """A folder the engine writes caches to (compiled kernels, graphs): a
    container deploy keeps it in a volume so a restart starts warm."""

    name: str  # volume name
    path: str  # where the engine writes it inside its image


@dataclass(frozen=True)
class CommandWords:
    """How the engine's launch command is laid out, for the code that reruns
    or redeploys a profile's argv without knowing the engine: which flags
    carry the listening address and the host folders a container mounts,
    and how the program is started."""

    host: str = "--host"
    port: str = "--port"
    # flags whose value is a host folder a container mounts
    model: tuple[str, ...] = ("--model",)
    tokenizer: tuple[str, ...] = ("--tokenizer",)
    # "module": argv is ``python -m <module> <args>`` (the image runs the
    # same module with its own python3); "program": ``<program> <args>``,
    # and the image starts it as ``image_command`` (its entrypoint script,
    # say), or by the program's name when that is empty.
    layout: str = "module"
    image_command: tuple[str, ...] = ()

    def split(self, argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """(what starts the server in the engine's image, its arguments), or
        None when ``argv`` is not laid out as this engine's."""
        if self.layout == "module":
            if len(argv) < 3 or argv[1] != "-m":
                return None
            return ["python3", "-m", argv[2]], list(argv[3:])
        if not argv:
            return None
        return list(self.image_command) or [argv[0].rsplit("/", 1)[-1]], list(argv[1:])


@dataclass(frozen=True)
class CpuBinding:
    """How a launch pins its threads to CPUs, as a unit states it:
    ``setting`` (the environment that says so), ``what`` (in words), and
    ``cpus``, the CPUs it pins to (None: the engine picks them, or nothing
    is pinned), which must lie inside the unit's CPUAffinity=."""

    setting: str
    what: str
    cpus: frozenset[int] | None = None
