"""The engine contract (``Engine``): what an inference engine adapter must
provide, and the optional hooks it may fill in.

An adapter is pure: it describes the tunable space and builds the launch
command, and never starts a process (``qtune.server`` does, for any engine).

Lifecycle of one trial, and who owns each step:

    probe (qtune.host) → space (adapter) → sample (qtune.search)
    → check (adapter) → launch_spec (adapter) → start/ready/stop (qtune.server)
    → load (qtune.load) → classify failures (adapter) → record (qtune.search)

``LaunchSpec`` and ``MetricNames`` belong to the runner and the load client
(``qtune.launch``); they are re-exported here for adapters.

This module holds the contract alone: the required methods and about 40
optional hooks, each with its default and a docstring that says what the
rest of qtune does with it.  The values they take and return
(``Param``, ``SpaceContext``, ``Failure``, ...) live in
``qtune.engines.contract_types``, and the helpers adapters share
(command-line words, the engine's own argument JSON, ``classify_by_patterns``)
in ``qtune.engines.helpers``; both are re-exported here, the one import
path adapters use.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qtune.engines.contract_types import (
    CacheVolume,
    CommandWords,
    CpuBinding,
    Failure,
    FixedArgs,
    LoadView,
    Param,
    SpaceContext,
)
from qtune.engines.helpers import (
    abbreviated_flag,
    cached_engine_json,
    classify_by_patterns,
    engine_json,
    int_flag,
    to_flag,
)
from qtune.estimate import Estimate
from qtune.host import Finding, HostFacts
from qtune.host.installed import Detect, EngineInstall, Found, PythonFacts, pythonpath_of
from qtune.launch import IGNORE_EOS, LaunchSpec, MetricNames, RunningConfig, StartPhases

__all__ = [
    "CacheVolume", "CommandWords", "CpuBinding", "Engine", "Failure", "FixedArgs",
    "LaunchSpec", "LoadView", "MetricNames", "Param", "RunningConfig", "int_flag",
    "SpaceContext", "StartPhases", "abbreviated_flag", "cached_engine_json",
    "classify_by_patterns", "engine_json", "to_flag",
]


class Engine(abc.ABC):
    """An inference engine adapter.  Subclasses implement the abstract
    methods; every other method is an optional hook whose default says "this
    engine has nothing to add here", so an engine is one file (a subclass)
    and one line in ``qtune.engines.ENGINES``.  Only the adapter names the
    engine's flags, metric names, image, cache paths and log lines."""

    name: str

    # Required

    @abc.abstractmethod
    def space(self, ctx: SpaceContext) -> list[Param]:
        """The tunables for this host, model and build."""

    @abc.abstractmethod
    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        """Params for the engine-defaults baseline trial (normally ``{}``) and
        a note when something had to be set for the defaults to start here."""

    @abc.abstractmethod
    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        """Violated hard constraints (the engine would refuse to start)."""

    @abc.abstractmethod
    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        """The command, environment and log patterns that start ``params``
        (its ``fatal_patterns`` and ``idle_patterns`` are the engine's log
        lines the runner watches for)."""

    @abc.abstractmethod
    def classify(self, log_text: str) -> Failure:
        """Why a start failed, from its log (``classify_by_patterns``)."""

    # Optional hooks

    # What finds the engine in a Python (``qtune.host.installed``); None: it
    # is found another way (``find_install``).
    detect: Detect | None = None

    def find_install(self, facts: PythonFacts | None,
                     python: str) -> tuple[EngineInstall | None, list[str]]:
        """The engine as installed for ``python`` from what ``detect`` found
        there, and notes on what it lacks to start.  Default: its version,
        built for the build torch was made for, with the PYTHONPATH it was
        found under."""
        found = facts.found.get(self.name) if facts is not None else None
        if found is None or facts is None:
            return None, []
        return EngineInstall(self.name, found.version, self.install_build(found, facts),
                             python, found.location, pythonpath_of(found.location)), []

    def install_build(self, found: Found, facts: PythonFacts) -> str:
        """The build of an install ``find_install`` found (``cpu``, ``cuda``,
        ``rocm``).  Default: torch's."""
        return facts.torch_build

    def host_findings(self, facts: HostFacts) -> list[Finding]:
        """What ``qtune probe`` says about this host for this engine (a build
        that does not match the hardware, a library it wants).  Default:
        nothing."""
        return []

    def read_args(self, install: EngineInstall) -> dict[str, Any] | None:
        """The installed engine's own arguments, ``{dest: {flag, kind,
        default, choices}}`` (``SpaceContext.engine_args``).  Default: None,
        "not known", and the adapter uses its built-in facts."""
        return None

    def cached_args(self, version: str, build: str) -> dict[str, Any] | None:
        """``read_args``'s answer for that version and build as qtune cached
        it on this host, without starting the engine (a profile's params are
        checked against it at load).  Default: None, not known."""
        return None

    def leaves_out(self, name: str, value: Any) -> bool:
        """Whether ``launch_spec`` writes nothing for ``name`` at ``value``
        (a "none" that means the model's own dtype, say): a profile's argv
        then holds no flag for it.  Default: False."""
        return False

    def shape(
        self, params: list[Param], ctx: SpaceContext, load: LoadView
    ) -> tuple[list[Param], dict[str, Any], list[str]]:
        """Narrow the space with what the load and the defaults run showed:
        (params, values fixed instead of tuned, one note per change).  Only
        parameters the user did not set in ``--space`` are passed in.
        Default: the params unchanged, nothing fixed, no note."""
        return params, {}, []

    def seeds(self, params: list[Param], ctx: SpaceContext,
              fixed: Mapping[str, Any] | None = None) -> list[tuple[dict[str, Any], str]]:
        """Informed first points ``(point, why)``: a few of the tuned params
        set, the rest at the engine's defaults or the user's fixed values, run
        right after the baseline, before the sampler's own.  Default: none."""
        return []

    def memory_asks(self, failure_detail: str) -> tuple[str, ...]:
        """The params by which a config asks for memory at start, when a
        start failed because it asked for more than was free (any larger ask
        fails too): the search then refuses, without a launch, configs that
        ask at least as much.  Default: () (no failure is read that way)."""
        return ()

    def estimate(self, params: Mapping[str, Any], ctx: SpaceContext) -> Estimate | None:
        """Will this config fit in memory (``qtune.estimate``)?  Default:
        None, no prediction: every config is launched."""
        return None

    # The parameters that count ranks (tensor, pipeline, data parallel): a
    # config occupies their product of GPUs, and a profile holds whole
    # numbers there (the deploy formats reserve GPUs from them).
    rank_params: tuple[str, ...] = ()

    def gpus_used(self, params: Mapping[str, Any]) -> int:
        """GPUs a config occupies (NUMA placement, deploy resources): the
        product of its rank counts, 1 without any."""
        return math.prod(int(params.get(k, 1)) for k in self.rank_params)

    def metric_names(self) -> MetricNames | None:
        """The names of the engine's Prometheus metrics (``/metrics``).
        Default: None, the server view is not read."""
        return None

    def request_fields(self) -> dict[str, Any]:
        """Fields every load request carries so that the server generates
        exactly ``max_tokens`` tokens, end-of-sequence or not.  Default:
        ``{"ignore_eos": true}``, which vLLM's and SGLang's OpenAI servers
        take."""
        return dict(IGNORE_EOS)

    def cache_reset_paths(self) -> tuple[str, ...]:
        """Paths that empty the server's prefix cache on a POST, tried in
        order, before a measured phase.  Default: () (not offered)."""
        return ()

    def max_model_len(self, argv: Sequence[str]) -> int | None:
        """The context length a launch command sets explicitly, read back
        from a profile's argv (``qtune verify``).  Default: None (not set)."""
        return None

    def image(self, build: str, version: str) -> str | None:
        """The engine's published container image for ``build`` at
        ``version`` (the container emitters; ``--image`` overrides).
        Default: None, no image known."""
        return None

    def cache_volumes(self) -> tuple[CacheVolume, ...]:
        """Folders a container of this engine writes caches to.  Default:
        none."""
        return ()

    def command_words(self) -> CommandWords:
        """How ``launch_spec``'s argv is laid out (the deploy formats rewrite
        its address and model folders).  Default: ``python -m <module>`` with
        ``--host``, ``--port``, ``--model`` and ``--tokenizer``."""
        return CommandWords()

    def start_phases(self, log_text: str, ready_s: float) -> StartPhases:
        """Where a start of ``ready_s`` seconds went, from its log (weights,
        compile and whether its cache had it, graph capture, engine init).
        Default: nothing read, the whole start unaccounted."""
        return StartPhases(ready_s=ready_s)

    def cpu_binding(self, env: Mapping[str, str], build: str) -> CpuBinding | None:
        """How a launch with ``env`` on ``build`` pins its threads (the
        systemd unit states it and checks it against CPUAffinity=); a
        malformed value raises InputError.  Default: None (the engine does
        not pin its threads)."""
        return None

    def cpu_cache_memory(self, env: Mapping[str, str],
                         host_gib: float | None) -> tuple[float, str] | None:
        """A CPU build's KV cache in host memory under ``env``, in GiB and in
        words (the container formats request it), given the memory of the
        host share it runs on (None: not known).  Default: None (unknown:
        the container formats guess and say so)."""
        return None

    def compile_cache_env(self, root: Path) -> dict[str, str]:
        """Environment that puts the engine's compile caches under ``root``
        (a folder qtune keeps on this host, so every start of a study, its
        confirmation and later studies reuse what an earlier start
        compiled).  Trial servers only: never part of a profile.  Default:
        {} (nothing compiled, or no way to place it)."""
        return {}

    def pinned_for_cache(self, params: Sequence[Param], fixed: Mapping[str, Any],
                         ctx: SpaceContext) -> dict[str, Any]:
        """Values to fix when they are not searched, because they would
        otherwise follow a searched one into the compile cache's key and make
        configs that share everything compiled compile again (vLLM's CUDA
        graph capture sizes follow max_num_seqs).  Default: {}."""
        return {}

    def report_paths(self) -> tuple[str, ...]:
        """GET paths on a running server that describe what it runs (its
        version, its configuration), for ``qtune check``.  Default: ()."""
        return ()

    def running_config(self, reports: Mapping[str, str]) -> RunningConfig:
        """The version and launch parameters a running server reports, from
        the bodies of ``report_paths`` (a path that did not answer is
        absent).  Untrusted text: never raise on it.  Default: nothing."""
        return RunningConfig()

    def install_hint(self) -> str:
        """What to install, or pass, when the engine is not found for the
        ``--engine-python`` the probe ran (the error's hint).  Default:
        install it there or point at its environment."""
        return (f"install {self.name} in the engine's environment and pass "
                "--engine-python PATH of its Python")


    def speculative(self, ctx: SpaceContext) -> tuple[list[dict[str, Any]], list[str]]:
        """Speculative decoding for the spec phase (``qtune.search.
        speculative``), run on top of the best base config once it is known:
        (candidates, each the params added to the base config; one note per
        method the build has that cannot run here, and why).  Default:
        nothing to try."""
        return [], [f"{self.name}: no speculative decoding known to qtune"]

    # Quality (qtune.quality): what the model answers on a real-weights server

    def changes_numerics(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The values of ``params`` that change the model's numerics against
        the engine defaults (a lossy KV cache or weight format): what
        ``--exact`` keeps out and what the quality gate is there for.
        Default: {} (none known)."""
        return {}

    def logprobs_request(self, model: str, text: str) -> tuple[str, dict[str, Any]] | None:
        """A request ``(path, JSON body)`` whose answer holds the model's
        log-probability of each token of ``text`` (``read_logprobs``).
        Default: None, the engine offers none, and quality is not measured."""
        return None

    def read_logprobs(self, answer: Any) -> list[float]:
        """The log-probabilities of ``text``'s tokens after the first, from
        the answer to ``logprobs_request``; ValueError when it has none."""
        raise ValueError(f"{self.name} answers no log-probabilities")

    def greedy_request(self, model: str, prompt: str,
                       max_tokens: int) -> tuple[str, dict[str, Any]]:
        """A request ``(path, JSON body)`` for exactly ``max_tokens`` greedy
        tokens after ``prompt``.  Default: OpenAI's completions API."""
        return "/v1/completions", {"model": model, "prompt": prompt,
                                   "max_tokens": max_tokens, "temperature": 0}

    def read_text(self, answer: Any) -> str:
        """The generated text of an answer to ``greedy_request`` (OpenAI's
        ``choices[0].text``); ValueError when it has none."""
        try:
            text = answer["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the answer has no choices[0].text") from None
        if not isinstance(text, str):
            raise ValueError("choices[0].text is not text")
        return text
