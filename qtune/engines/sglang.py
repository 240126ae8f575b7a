"""SGLang adapter: search space, launch command, failure classes, metrics.

Facts used here (SGLang 0.5.17, /work/research/sglang.md; the captured
arguments and help are in tests/engines/fixtures/):
- ``ServerArgs.add_cli_args`` builds the parser from the ``ServerArgs``
  dataclass, so the installed SGLang's argparse gives every flag, type,
  choice and default of *that* version (0.5.17: 458 dests).  Importing
  it pulls in torch and triton: the answer is cached per version.
- In 0.5.17 ``--cuda-graph-max-bs`` is a deprecated alias of
  ``--cuda-graph-max-bs-decode`` (dest ``cuda_graph_max_bs_decode``); older
  releases have only the first: the space uses whichever dest the
  installed version has.
- ``chunked_prefill_size > 0`` must be a multiple of ``page_size``
  (``check_server_args``); ``--served-model-name`` must not contain ':'.
- GPUs used = dp x tp x pp without DP attention (each replica a full TP
  group, ``data_parallel_controller.py``).
- Metrics need ``--enable-metrics`` and are exported by attention-TP rank 0
  of each DP replica only, labelled ``dp_rank``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from qtune.engines.base import (
    CacheVolume,
    CommandWords,
    Engine,
    Failure,
    LaunchSpec,
    LoadView,
    MetricNames,
    Param,
    SpaceContext,
    cached_engine_json,
    classify_by_patterns,
    engine_json,
    int_flag,
)
from qtune.host.installed import Detect, EngineInstall, Found, PythonFacts

_SERVER_MODULE = "sglang.launch_server"

# Root-cause lines (SGLang 0.5.17 sources, fixtures/sglang-0.5.17-log-lines.txt)
# → failure class; the wrappers ("Received sigquit", "Initialization failed")
# come last so the cause above them wins.
_FAILURES: list[tuple[str, str]] = [
    (r"Address already in use", "port_in_use"),
    (r"Not enough memory\. Please try to increase --mem-fraction-static", "oom"),
    (r"Capture (?:cuda|prefill CUDA) graph failed", "oom"),
    (r"(?:CUDA )?[Oo]ut of memory|OutOfMemoryError", "oom"),
    (r"scheduler died during initialization \(exit code: -9\)", "oom"),
    # another process holds part of a GPU (a server still stopping)
    (r"The memory capacity is unbalanced", "environment"),
    (r"sglang serve: error:|unrecognized arguments|invalid choice", "invalid_config"),
    (r"Cannot find any model weights|Repository Not Found|No such file", "environment"),
    (r"AssertionError|ValueError: .*", "invalid_config"),
    (r"CUDA error: .*", "crash"),
    (r"Initialization failed\. warmup error", "crash"),
    (r"Scheduler hit an exception", "crash"),
    (r"Received sigquit from a child process", "crash"),
]
# Out of memory because the config asked for more than the GPU has: a larger
# static fraction (less left for activations) with as many graphs fails too.
_OVER_REQUEST = (r"Capture (?:cuda|prefill CUDA) graph failed", r"CUDA out of memory")
# After these the server never becomes ready, though a process may linger.
_FATAL = (
    r"Received sigquit from a child process",
    r"scheduler died during initialization",
    r"Initialization failed\.",
    r"Address already in use",
)

_METRICS = MetricNames(
    kv_cache_usage="sglang:token_usage",
    requests_waiting="sglang:num_queue_reqs",
    requests_running="sglang:num_running_reqs",
    # a retraction is SGLang's preemption (the request goes back to the queue)
    preemptions="sglang:num_retracted_requests",
    # tokens, as vLLM's are: cached prompt tokens over all prompt tokens
    prefix_cache_queries="sglang:prompt_tokens",
    prefix_cache_hits="sglang:cached_tokens",
    prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens",
    request_success="sglang:num_requests",
    engine_label="dp_rank",
)

# lmsysorg/sglang's CUDA 13 serving image, without the development tools
# (release-docker-runtime.yml tags v{version}-cu130-runtime; a public deploy
# script pins v0.5.17-cu130-runtime by digest).
_IMAGE = "lmsysorg/sglang:v{version}-cu130-runtime"

# The dests the space uses, by the names older releases gave them.
_GRAPH_BS = ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")

# {dest: {flag, kind, default, choices, aliases}} of the installed SGLang.
_SCRIPT = r"""
import argparse, json
from sglang.srt.server_args import ServerArgs
try:
    from sglang.version import __version__ as version
except ImportError:
    version = None
p = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(p)
out = {}
for a in p._actions:
    if not a.option_strings or a.dest == "help":
        continue
    if a.dest in out:  # a deprecated alias of a flag already seen
        out[a.dest]["aliases"] += list(a.option_strings)
        continue
    t = getattr(a.type, "__name__", None)
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        kind = "flag"
    elif a.nargs == 0:
        kind = "flag"
    elif a.choices:
        kind = "choice"
    elif t in ("int", "human_readable_int"):
        kind = "int"
    elif t == "float":
        kind = "float"
    else:
        kind = "str"
    default = a.default if isinstance(a.default, (int, float, str, bool, type(None))) else None
    out[a.dest] = {"flag": a.option_strings[0], "kind": kind, "default": default,
                   "choices": [c for c in a.choices] if a.choices else None,
                   "aliases": list(a.option_strings[1:])}
print("QTUNE-ARGS" + json.dumps({"version": version, "args": out}, default=str))
"""


def read_server_args(install: EngineInstall, timeout: float = 240.0) -> dict[str, Any] | None:
    """The installed SGLang's arguments, cached per version; None when they
    cannot be read (the adapter then uses its 0.5.17 facts)."""
    # (an install found under PYTHONPATH was found with this environment's)
    data = engine_json(install, f"sglang-{install.version}-args-v1.json", _SCRIPT, timeout)
    args: dict[str, Any] | None = data.get("args") if isinstance(data, dict) else None
    return args


class SGLang(Engine):
    name = "sglang"
    detect = Detect(("sglang",), "sglang")

    def install_build(self, found: Found, facts: PythonFacts) -> str:
        return "cuda"  # SGLang's wheels are CUDA builds

    def leaves_out(self, name: str, value: Any) -> bool:
        return (name, value) == ("quantization", "none")  # the model's own dtype

    def cached_args(self, version: str, build: str) -> dict[str, Any] | None:
        return cached_engine_json(f"sglang-{version}-args-v1.json")

    def read_args(self, install: EngineInstall) -> dict[str, Any] | None:
        return read_server_args(install)

    def install_hint(self) -> str:
        return ("pip install 'sglang==0.5.17' (CUDA 13, torch 2.11) in the engine's "
                "environment, or pass --engine-python PATH of the Python it is in")

    def metric_names(self) -> MetricNames:
        return _METRICS

    def cache_reset_paths(self) -> tuple[str, ...]:
        # 400 while requests run: the load client calls it between phases
        return ("/flush_cache",)

    def max_model_len(self, argv: Sequence[str]) -> int | None:
        return int_flag(argv, "--context-length")

    def image(self, build: str, version: str) -> str | None:
        return _IMAGE.format(version=version.split("+")[0]) if build == "cuda" else None

    def cache_volumes(self) -> tuple[CacheVolume, ...]:
        # FlashInfer's JIT-compiled kernels (nvcc at first use: minutes)
        return (CacheVolume("sglang-flashinfer-cache", "/root/.cache/flashinfer"),)

    def command_words(self) -> CommandWords:
        # --model is an alias of --model-path; the tokenizer has no alias
        return CommandWords(model=("--model", "--model-path"), tokenizer=("--tokenizer-path",))

    @staticmethod
    def _dest(ctx: SpaceContext, *names: str) -> str | None:
        """The first of ``names`` the installed SGLang has (the first when
        its arguments are not known)."""
        if ctx.engine_args is None:
            return names[0]
        return next((n for n in names if n in ctx.engine_args), None)

    @staticmethod
    def _choices(ctx: SpaceContext, dest: str, wanted: tuple[Any, ...]) -> tuple[Any, ...]:
        info = (ctx.engine_args or {}).get(dest) or {}
        have = info.get("choices")
        return tuple(c for c in wanted if have is None or c in have)

    def space(self, ctx: SpaceContext) -> list[Param]:
        params = [
            Param("mem_fraction_static", "float", low=0.70, high=0.93, step=0.01,
                  help="fraction of GPU memory for weights and the KV cache"),
            Param("max_running_requests", "int", low=8, high=1024, log=True,
                  help="most requests decoded at once"),
            Param("chunked_prefill_size", "choice", choices=(2048, 4096, 8192, 16384),
                  help="prefill chunk in tokens"),
            Param("max_prefill_tokens", "choice", choices=(4096, 8192, 16384, 32768),
                  help="token budget of one prefill batch"),
            Param("schedule_conservativeness", "float", low=0.3, high=1.5, step=0.1,
                  help="how much KV room the scheduler keeps back (lower: admits more)"),
            Param("enable_mixed_chunk", "bool", help="run prefill chunks with decodes"),
            Param("stream_interval", "choice", choices=(1, 4, 16),
                  help="tokens per streamed chunk (1: every token)"),
            Param("disable_radix_cache", "bool", help="turn prefix (radix) caching off"),
        ]
        policies = self._choices(ctx, "schedule_policy", ("fcfs", "lpm", "lof"))
        if len(policies) > 1:
            params.append(Param("schedule_policy", "choice", choices=policies,
                                help="order of the waiting queue (lpm: longest prefix)"))
        graph = self._dest(ctx, *_GRAPH_BS)
        if graph and ctx.host.gpus:
            params.append(Param(graph, "choice", choices=(64, 128, 256, 512),
                                help="largest decode batch replayed from a CUDA graph"))
        tps = _valid_tp_sizes(ctx)
        if len(tps) > 1:
            params.append(Param("tp_size", "choice", choices=tuple(tps)))
        dps = [d for d in (1, 2, 4, 8) if d <= max(len(ctx.host.gpus), 1)]
        if len(dps) > 1:
            params.append(Param("dp_size", "choice", choices=tuple(dps),
                                help="engine replicas behind SGLang's router"))
        fp8 = not ctx.exact and bool(ctx.host.gpus) and all(
            _cc(g.compute_capability) >= (8, 9) for g in ctx.host.gpus)
        if fp8:
            kv = self._choices(ctx, "kv_cache_dtype", ("auto", "fp8_e4m3"))
            if len(kv) > 1:
                params.append(Param("kv_cache_dtype", "choice", choices=kv,
                                    help="KV cache precision"))
            quant = self._choices(ctx, "quantization", ("fp8",))
            if quant and not ctx.model.config.get("quantization_config"):
                params.append(Param("quantization", "choice", choices=("none", *quant),
                                    help="weights quantized to fp8 at load"))
        if ctx.engine_args is not None:
            params = [p for p in params if p.name in ctx.engine_args]
        return params

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        return {}, None

    def shape(
        self, params: list[Param], ctx: SpaceContext, load: LoadView
    ) -> tuple[list[Param], dict[str, Any], list[str]]:
        """Cut what this load cannot use, from facts of the load alone: a
        client that keeps at most C requests in flight never fills more
        than C running slots, and a prefix-ordered queue (``lpm``) orders
        nothing when no prompt shares a prefix."""
        out: list[Param] = []
        fixed: dict[str, Any] = {}
        notes: list[str] = []
        for p in params:
            if p.name == "max_running_requests" and p.kind == "int" and load.concurrency:
                lo, hi = (int(b) for b in p.bounds)
                hi = max(lo, min(hi, load.concurrency))
                if hi != p.high:
                    notes.append(f"max_running_requests {lo}..{hi}: the client keeps at "
                                 f"most {load.concurrency} in flight")
                    if lo == hi:
                        fixed[p.name] = lo
                        continue
                    p = dataclasses.replace(p, high=hi)
            if p.name == "schedule_policy" and p.kind == "choice" and not load.shared_prefix:
                keep = tuple(c for c in p.choices if c not in ("lpm", "dfs-weight"))
                if len(keep) < len(p.choices):
                    notes.append(f"schedule_policy in {list(keep)}: the prompts share no "
                                 "prefix for lpm to order by")
                    if len(keep) == 1:
                        fixed[p.name] = keep[0]
                        continue
                    p = dataclasses.replace(p, choices=keep)
            out.append(p)
        return out, fixed, notes

    rank_params = ("tp_size", "pp_size", "dp_size")

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        out = []
        chunk = params.get("chunked_prefill_size")
        page = int(params.get("page_size") or 1)
        if chunk is not None and int(chunk) > 0 and int(chunk) % page:
            out.append(f"chunked_prefill_size ({chunk}) is not a multiple of "
                       f"page_size ({page})")
        if ":" in ctx.model.served_name:
            out.append(f"served model name {ctx.model.served_name!r} contains ':'")
        tp = params.get("tp_size")
        if tp is not None and tp not in _valid_tp_sizes(ctx):
            out.append(f"tp_size {tp} does not divide the attention heads")
        n = self.gpus_used(params)
        if n > 1 and n > len(ctx.host.gpus):
            out.append(f"tp x pp x dp sizes ({n}) > {len(ctx.host.gpus)} GPUs")
        return out

    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        m = ctx.model
        # --model is 0.5.17's alias of --model-path, the word every engine's
        # command shares; a version without the alias gets --model-path
        aliases = ((ctx.engine_args or {}).get("model_path") or {}).get("aliases")
        model_flag = "--model-path" if aliases is not None and "--model" not in aliases \
            else "--model"
        argv = [ctx.install.python or "python3", "-m", _SERVER_MODULE,
                model_flag, str(m.path), "--served-model-name", m.served_name]
        if m.tokenizer_dir != m.path:
            argv += ["--tokenizer-path", str(m.tokenizer_dir)]
        if m.load_format:
            argv += ["--load-format", m.load_format]
        if ctx.max_model_len:
            argv += ["--context-length", str(ctx.max_model_len)]
        # the server view (qtune.load.prometheus) and a deploy's monitoring
        argv += ["--enable-metrics", "--host", host, "--port", str(port)]
        env = {"HF_HUB_OFFLINE": "1"}
        if ctx.install.pythonpath:
            env["PYTHONPATH"] = ctx.install.pythonpath
        args = ctx.engine_args or {}
        for name, value in sorted(params.items()):
            if self.leaves_out(name, value):
                continue  # the model's own dtype
            if name.isupper():
                env[name] = str(value)
                continue
            info = args.get(name)
            flag = info["flag"] if info else "--" + name.replace("_", "-")
            if isinstance(value, bool) or (info and info["kind"] == "flag"):
                argv += [flag] if value else []
            else:
                argv += [flag, str(value)]
        return LaunchSpec(argv=tuple(argv), env=env, host=host, port=port,
                          served_model=m.served_name, fatal_patterns=_FATAL)

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, _FAILURES)

    def memory_asks(self, failure_detail: str) -> tuple[str, ...]:
        if any(re.search(p, failure_detail) for p in _OVER_REQUEST):
            return ("mem_fraction_static", *_GRAPH_BS)
        return ()


def _valid_tp_sizes(ctx: SpaceContext) -> list[int]:
    n_gpus = max(len(ctx.host.gpus), 1)
    heads, kv = ctx.model.num_heads, ctx.model.num_kv_heads
    out = [tp for tp in range(1, n_gpus + 1) if not heads % tp
           and (not kv or kv % tp == 0 or tp % kv == 0)]
    return out or [1]


def _cc(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)
