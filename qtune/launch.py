"""What qtune needs to start, watch and measure one server, in no engine's
terms: the runner (``qtune.server``) and the load client (``qtune.load``) own
these types and know no engine; an engine adapter (``qtune.engines``) fills
them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# What a request carries so that the server generates exactly ``max_tokens``
# tokens whatever the model would say (the load must not depend on what the
# weights happen to generate): the OpenAI servers' extension that vLLM and
# SGLang accept.  An engine that refuses it names its own (``Engine.
# request_fields``).
IGNORE_EOS: Mapping[str, Any] = MappingProxyType({"ignore_eos": True})


@dataclass(frozen=True)
class LaunchSpec:
    """Everything ``qtune.server`` needs to start and watch one server."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int
    served_model: str
    health_path: str = "/health"
    # Ready once this lists ``served_model``; None: a server whose listing
    # does not name the model it serves, ready once ``health_path`` answers.
    models_path: str | None = "/v1/models"
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
class MetricNames:
    """The Prometheus sample names by which a server reports what the load
    client cannot see (``qtune.load.prometheus`` reads them).  Counters are
    read without their ``_total`` suffix.  None: the engine reports no such
    metric (TGI has no KV-cache gauge), and the server view says "not
    measured" for it rather than 0."""

    # gauges, read during the measured phase
    kv_cache_usage: str | None  # fraction of the KV cache in use (per engine: never summed)
    requests_waiting: str | None
    requests_running: str | None
    # counters, read before and after it
    preemptions: str | None
    prefix_cache_queries: str | None
    prefix_cache_hits: str | None
    prompt_tokens: str | None
    generation_tokens: str | None
    request_success: str | None
    # gauge name -> the names older releases gave it
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the label that tells data-parallel replicas apart (vLLM's "engine",
    # SGLang's "dp_rank"): other labels are summed over
    engine_label: str = "engine"
    # histograms (base names, seconds) for the emitted alert rules
    # (qtune.emit.prometheus); None where the engine exports none
    ttft_seconds: str | None = None
    tpot_seconds: str | None = None
    itl_seconds: str | None = None
    e2e_seconds: str | None = None
    # the label naming the served model on every sample
    model_label: str | None = None
    # speculative decoding's counters (drafts proposed, draft tokens in
    # them, draft tokens the target accepted): the acceptance rate
    spec_drafts: str | None = None
    spec_draft_tokens: str | None = None
    spec_accepted_tokens: str | None = None

    @property
    def gauges(self) -> tuple[str, ...]:
        return tuple(g for g in (self.kv_cache_usage, self.requests_waiting,
                                 self.requests_running) if g is not None)


@dataclass(frozen=True)
class RunningConfig:
    """What a running server says it runs (``qtune check``), read by its
    adapter from the bodies of ``Engine.report_paths``: the engine version
    and the launch parameters it reports, by the names of the engine's
    space.  A parameter absent here is one the server does not report."""

    version: str | None = None
    params: Mapping[str, object] = field(default_factory=dict)
    # where each parameter was read ("/metrics cache_config_info", ...)
    sources: Mapping[str, str] = field(default_factory=dict)



@dataclass(frozen=True)
class StartPhases:
    """Where a server's start went, read by its adapter from the start's log
    (``Engine.start_phases``) and the runner's own clock: loading the
    weights, compiling (and whether the compile cache had it), capturing
    graphs, the rest of the engine's initialisation (memory profile, KV
    cache, warm-up), and what is left of ``ready_s`` (the process, imports,
    the API server).  None: the log did not say."""

    ready_s: float
    weights_s: float | None = None
    compile_s: float | None = None
    graphs_s: float | None = None
    init_s: float | None = None  # the engine's init, compile and graphs included
    cache_hit: bool | None = None  # None: nothing compiled, or not said

    @property
    def other_s(self) -> float:
        """The start less what the log accounted for."""
        known = (self.weights_s or 0.0) + (self.init_s or 0.0)
        return max(0.0, self.ready_s - known)

    def to_dict(self) -> dict[str, float | bool | None]:
        return {"ready_s": round(self.ready_s, 3), "weights_s": self.weights_s,
                "compile_s": self.compile_s, "graphs_s": self.graphs_s,
                "init_s": self.init_s, "other_s": round(self.other_s, 3),
                "cache_hit": self.cache_hit}

    def text(self) -> str:
        """One line: ``start 64 s: weights 3 s, compile 9 s (cached), ...``."""
        parts = []
        for label, v in (("weights", self.weights_s), ("compile", self.compile_s),
                         ("graphs", self.graphs_s)):
            if v is not None:
                extra = ""
                if label == "compile" and self.cache_hit is not None:
                    extra = " (cache hit)" if self.cache_hit else " (cache miss)"
                parts.append(f"{label} {v:.0f} s{extra}")
        if self.init_s is not None:
            rest = self.init_s - (self.compile_s or 0.0) - (self.graphs_s or 0.0)
            parts.append(f"engine init {max(rest, 0.0):.0f} s")
        parts.append(f"process and API {self.other_s:.0f} s")
        return f"start {self.ready_s:.0f} s: " + ", ".join(parts)
