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

Over 500 lines: the contract is about 40 optional hooks, each with the
default that means "nothing to add" and a docstring that says what the rest
of qtune does with it; the helpers adapters share sit at the end.
"""

from __future__ import annotations

import abc
import json
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qtune.estimate import Estimate
from qtune.host import Finding, HostFacts
from qtune.host.installed import Detect, EngineInstall, Found, PythonFacts, pythonpath_of
from qtune.launch import IGNORE_EOS, LaunchSpec, MetricNames, RunningConfig, StartPhases
from qtune.model import ModelInfo, cache_dir

__all__ = [
    "CacheVolume", "CommandWords", "Engine", "Failure", "FixedArgs", "LaunchSpec", "LoadView",
    "MetricNames", "Param", "RunningConfig", "int_flag", "SpaceContext", "StartPhases",
    "cached_engine_json", "classify_by_patterns", "engine_json", "to_flag",
]


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


# Flags qtune reads or checks in a profile's argv, of every engine: where the
# server listens and what it serves (emitters publish, health-check and mount
# from them) and the secret-bearing ones (refused in a profile).  A prefix of
# one of them is what argparse (allow_abbrev, vLLM's and SGLang's default)
# reads as the whole flag.
CHECKED_FLAGS = ("--host", "--port", "--model", "--model-path", "--tokenizer",
                 "--tokenizer-path", "--served-model-name", "--uds", "--api-key",
                 "--admin-api-key", "--hf-token", "--token", "--ssl-keyfile",
                 "--ssl-certfile", "--ssl-ca-certs", "--ssl-keyfile-password",
                 "--password", "--secret", "--download-dir", "--config")


def abbreviated_flag(args: Sequence[str], known: Sequence[str] = CHECKED_FLAGS
                     ) -> tuple[int, str, str] | None:
    """The first argument (index, as given, the flag it stands for) that
    argparse would read as an abbreviation of one of ``known``: a long flag
    that is not itself known but a strict prefix of a known one.  None when
    there is none.  Arguments after ``--`` are positional, as for argparse."""
    known_set = set(known)
    for i, a in enumerate(args):
        if a == "--":
            break
        if not a.startswith("--") or len(a) <= 2:
            continue
        name = a.split("=", 1)[0]
        if name in known_set:
            continue
        full = [k for k in known if k.startswith(name)]
        if full:
            return i, name, full[0]
    return None


def int_flag(argv: Sequence[str], flag: str) -> int | None:
    """The value of ``flag`` in a launch command, when it is set there."""
    if flag in argv[:-1]:
        return int(argv[list(argv).index(flag) + 1])
    return None


def cached_engine_json(cache_name: str) -> dict[str, Any] | None:
    """The mapping ``engine_json`` cached under ``cache_name`` on this host,
    or None (never runs the engine)."""
    path = cache_dir() / "engines" / cache_name
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def to_flag(name: str, value: Any, info: Mapping[str, Any] | None = None) -> list[str]:
    """The words that set ``name`` to ``value`` on an engine's command line;
    ``info`` is the installed engine's description of the flag
    (``Engine.read_args``), if known: its ``flag``, its ``kind`` and, for a
    boolean flag with one, its ``negative`` form (``--no-compile``)."""
    flag = info["flag"] if info else "--" + name.replace("_", "-")
    if info and info["kind"] == "flag":
        if value:
            return [flag]
        # store_true has only the positive form; a switch pair has both
        return [info["negative"]] if info.get("negative") else []
    if isinstance(value, Mapping):  # a config given as JSON (--speculative-config)
        return [flag, json.dumps(dict(value), sort_keys=True, separators=(",", ":"))]
    if isinstance(value, bool):
        return [flag] if value else ["--no-" + flag[2:]]
    return [flag, str(value)]


def engine_json(install: EngineInstall, cache_name: str, script: str,
                timeout: float) -> Any:
    """What ``script``, run by the engine's own Python, prints after
    ``QTUNE-ARGS`` (JSON), cached under ``cache_name`` (name it by version and
    build); None when it cannot be run or read.  The engines' argument
    readers use it: importing an engine costs seconds to minutes."""
    if install.python is None:
        return None
    path = cache_dir() / "engines" / cache_name
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    try:
        proc = subprocess.run([install.python, "-c", script], capture_output=True,
                              text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("QTUNE-ARGS")),
                None)
    if proc.returncode != 0 or line is None:
        return None
    try:
        data = json.loads(line[len("QTUNE-ARGS"):])
    except ValueError:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return data


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
