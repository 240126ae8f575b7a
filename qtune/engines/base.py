"""The engine protocol: what an inference engine adapter must provide.

An adapter is pure: it describes the tunable space and builds the launch
command, and never starts a process (``qtune.server`` does, for any engine).

Lifecycle of one trial, and who owns each step:

    probe (qtune.host) → space (adapter) → sample (qtune.search)
    → check (adapter) → launch_spec (adapter) → start/ready/stop (qtune.server)
    → load (qtune.load) → classify failures (adapter) → record (qtune.search)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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
class LaunchSpec:
    """Everything ``qtune.server`` needs to start and watch one server."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int
    served_model: str
    health_path: str = "/health"
    models_path: str = "/v1/models"
    # Log lines after which the server will never become ready even though
    # its process may linger (vLLM's API server can hang after its engine
    # core died): the runner stops waiting as soon as one appears.
    fatal_patterns: tuple[str, ...] = ()
    # Log lines that show the server waiting, not progressing (vLLM's engine
    # core repeats one while its workers are silent): a start whose log shows
    # nothing else for long is hung, not slow.
    idle_patterns: tuple[str, ...] = ()
    # Defaults for runs on this host only, never part of a profile (the
    # caller's environment and ``env`` win): the runner gives each server a
    # private TMPDIR, removed with it, so an engine that keeps a cache under
    # the temp dir points it back at the shared one here.
    host_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


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


class Engine(Protocol):
    name: str

    def space(self, ctx: SpaceContext) -> list[Param]:
        """The tunables for this host, model and build."""
        ...

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        """Params for the engine-defaults baseline trial (normally ``{}``) and
        a note when something had to be set for the defaults to start here."""
        ...

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        """Violated hard constraints (the engine would refuse to start)."""
        ...

    def shape(
        self, params: list[Param], ctx: SpaceContext, load: LoadView
    ) -> tuple[list[Param], dict[str, Any], list[str]]:
        """Narrow the space with what the load and the defaults run showed:
        (params, values fixed instead of tuned, one note per change).  Only
        parameters the user did not set in ``--space`` are passed in."""
        ...

    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        ...

    def classify(self, log_text: str) -> Failure:
        ...

    # Optional: ``memory_asks(failure_detail) -> tuple[str, ...]``, the params
    # by which a config asks for memory at start, when a start failed because
    # it asked for more than was free (any larger ask fails too).  The search
    # then refuses, without a launch, configs that ask at least as much.
    # Optional: ``seeds(params, ctx, fixed) -> list[(point, why)]``, informed
    # first points (a few of the tuned params set, the rest at the engine's
    # defaults or the user's fixed values) run right after the baseline,
    # before the sampler's own.
    # Optional: ``gpus_used(params) -> int``, the GPUs a config occupies (for
    # NUMA placement); 1 when absent.


def classify_by_patterns(
    log_text: str, patterns: list[tuple[str, str]], default: str = "crash"
) -> Failure:
    """First matching (regex, reason) wins; the detail is the matching line."""
    for pattern, reason in patterns:
        m = re.search(pattern, log_text, re.M)
        if m:
            start = log_text.rfind("\n", 0, m.start()) + 1
            end = log_text.find("\n", m.end())
            line = log_text[start : end if end >= 0 else None].strip()
            # "(EngineCore pid=1) ERROR 11-29 23:53:35 [core.py:1510] msg" → msg
            line = re.sub(r"^\([^)]*\)\s+[A-Z]+\s+[\d-]+\s+[\d:]+\s+\[[^\]]*\]\s*",
                          "", line)
            return Failure(reason, line[:400])
    lines = [ln.strip() for ln in log_text.strip().splitlines() if ln.strip()]
    # The last line is often a stack frame ("frame #22: _start + 0x25"); the
    # last line that names an error says more.
    errors = [ln for ln in lines if re.search(r"Error\b|Exception\b|error:", ln)]
    pick = errors[-1] if errors else lines[-1] if lines else "no output"
    return Failure(default, pick[-400:])
