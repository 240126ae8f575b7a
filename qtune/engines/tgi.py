"""Text Generation Inference adapter, from ``text-generation-launcher``.

TGI is in maintenance upstream, and no TGI server installs here: this
adapter is built and tested on the last release's own material (v3.3.7,
huggingface/text-generation-inference at dfb3fbe7; tests/engines/fixtures/),
and has not started a TGI server.  Facts used here:
- The launcher is a Rust binary (clap): ``--help`` lists every option with
  ``[default: ...]`` and ``[possible values: ...]``, which is how the
  installed version's arguments are read.  It starts the Python shard
  server ``text-generation-server`` and the router, both from ``PATH``.
- Hard constraints (launcher/src/main.rs, backends/v3/src/main.rs):
  ``max_input_tokens < max_total_tokens``; ``max_total_tokens <=
  max_batch_total_tokens``; ``max_batch_prefill_tokens <=
  max_batch_total_tokens``; and ``max_batch_prefill_tokens >=
  max_input_tokens`` unless the model runs chunked prefill.
- Without ``--num-shard`` the launcher shards over every visible GPU.
- ``/metrics`` on the serving port (and on ``--prometheus-port``) gives
  ``tgi_`` metrics; there is no KV-cache or prefix-cache metric.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from qtune.engines.base import (
    CommandWords,
    Engine,
    Failure,
    LaunchSpec,
    MetricNames,
    Param,
    SpaceContext,
    classify_by_patterns,
    int_flag,
)
from qtune.host.installed import EngineInstall, PythonFacts

_LAUNCHER = "text-generation-launcher"

# Root-cause lines (v3.3.7 sources) → failure class; the launcher's own
# wrap-up ("Shard N failed to start", "Error: ShardCannotStart") comes last.
_FAILURES: list[tuple[str, str]] = [
    (r"Address already in use", "port_in_use"),
    (r"Not enough memory to handle", "oom"),
    (r"(?:CUDA )?[Oo]ut of memory|OutOfMemoryError", "oom"),
    (r"not enough cuda devices", "invalid_config"),
    (r"must be [<>]=? `max_|Invalid argument:|ArgumentValidation", "invalid_config"),
    (r"error: (?:invalid value|unexpected argument)", "invalid_config"),
    (r"text-generation-(?:server|router) not found in PATH", "environment"),
    (r"Download encountered an error|DownloadError", "environment"),
    (r"Unable to warmup the Python model shards", "crash"),
    (r"Shard \d+ failed to start|Shard \d+ crashed|Webserver Crashed", "crash"),
    (r"Error: \w+", "crash"),
]
# The prefill budget the warm-up could not hold: a larger one fails too.
_OVER_REQUEST = (r"Not enough memory to handle \d+ prefill tokens",)
_FATAL = (r"Shard \d+ failed to start", r"Shard \d+ crashed", r"Webserver Crashed",
          r"(?m)^Error: ")

_METRICS = MetricNames(
    kv_cache_usage=None,
    requests_waiting="tgi_queue_size",
    requests_running="tgi_batch_current_size",
    preemptions=None,
    prefix_cache_queries=None,
    prefix_cache_hits=None,
    # histograms: their _sum adds up the tokens of the requests seen
    prompt_tokens="tgi_request_input_length_sum",
    generation_tokens="tgi_request_generated_tokens_sum",
    request_success="tgi_request_success",
)

# ghcr.io tags are the release's semver ("3.3.7"); ROCm images end "-rocm".
_IMAGES = {"cuda": "ghcr.io/huggingface/text-generation-inference:{version}",
           "rocm": "ghcr.io/huggingface/text-generation-inference:{version}-rocm"}

_OPTION = re.compile(r"^\s+(?:-\w, )?(--[a-z0-9-]+)(?: <([A-Z0-9_]+)>)?\s*$")


def parse_help(text: str) -> dict[str, Any]:
    """``{dest: {flag, kind, default, choices}}`` from the launcher's
    ``--help`` (also from TGI's docs page of it, which wraps each option in a
    heading and a code block)."""
    out: dict[str, Any] = {}
    cur: dict[str, Any] | None = None
    listing = False
    for line in text.splitlines():
        m = _OPTION.match(line)
        if m:
            flag, value = m.groups()
            if flag in ("--help", "--version"):
                cur = None
                continue
            cur = {"flag": flag, "kind": "str" if value else "flag", "default": None,
                   "choices": None}
            out[flag[2:].replace("-", "_")] = cur
            listing = False
            continue
        if cur is None:
            continue
        s = line.strip()
        if s.startswith("[default: "):
            cur["default"] = _value(s[len("[default: "):-1])
        elif s.startswith("[possible values: "):
            cur["choices"] = [c.strip() for c in s[len("[possible values: "):-1].split(",")]
        elif s == "Possible values:":
            listing, cur["choices"] = True, []
        elif listing and s.startswith("- "):
            cur["choices"].append(s[2:].split(":", 1)[0].strip())
        elif listing and s and not s.startswith("- "):
            listing = False
    for info in out.values():
        if info["choices"]:
            info["kind"] = "choice"
        elif isinstance(info["default"], bool):
            info["kind"] = "bool"
        elif isinstance(info["default"], int):
            info["kind"] = "int"
        elif isinstance(info["default"], float):
            info["kind"] = "float"
    return out


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


class TGI(Engine):
    name = "tgi"

    def find_install(self, facts: PythonFacts | None,
                     python: str) -> tuple[EngineInstall | None, list[str]]:
        """TGI's launcher on PATH (it is no Python package), and whether the
        shard server and the router it starts are there too."""
        tgi = shutil.which("text-generation-launcher")
        if not tgi:
            return None, []
        try:
            ver = subprocess.run([tgi, "--version"], capture_output=True, text=True,
                                 timeout=20).stdout.split()[-1:]
        except (OSError, subprocess.TimeoutExpired):
            ver = []
        # The launcher starts its Python shard server and the router from
        # PATH; without them it exits at the first trial.
        notes = []
        missing = [p for p in ("text-generation-server", "text-generation-router")
                   if shutil.which(p) is None]
        if missing:
            notes.append(f"{tgi} found but {' and '.join(missing)} not on PATH: TGI "
                         "cannot start (run TGI's image, or `make install` in its "
                         "repository)")
        # "cuda": the launcher on PATH is the CUDA build's (ROCm and Gaudi
        # ship their own images); it cannot say so itself.
        return EngineInstall(self.name, ver[0] if ver else "unknown", "cuda", None, tgi), notes

    def leaves_out(self, name: str, value: Any) -> bool:
        return (name, value) in (("quantize", "none"), ("kv_cache_dtype", "auto"))

    def read_args(self, install: EngineInstall) -> dict[str, Any] | None:
        """The installed launcher's options, from its ``--help`` (a Rust
        binary: milliseconds, nothing to cache)."""
        try:
            proc = subprocess.run([install.location or _LAUNCHER, "--help"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        args = parse_help(proc.stdout) if proc.returncode == 0 else {}
        return args or None

    def install_hint(self) -> str:
        return ("TGI needs text-generation-launcher, text-generation-server and "
                "text-generation-router on PATH and an NVIDIA GPU: run it from its image "
                "ghcr.io/huggingface/text-generation-inference:3.3.7 or build it "
                "(`make install` in its repository); qtune has not run TGI itself")

    def metric_names(self) -> MetricNames:
        return _METRICS

    def max_model_len(self, argv: Sequence[str]) -> int | None:
        return int_flag(argv, "--max-total-tokens")

    def image(self, build: str, version: str) -> str | None:
        pattern = _IMAGES.get(build)
        return pattern.format(version=version.split("+")[0]) if pattern else None

    def command_words(self) -> CommandWords:
        # The image's entrypoint script activates the shard server's venv,
        # then execs the launcher with the arguments it was given.
        return CommandWords(host="--hostname", model=("--model-id",), tokenizer=(),
                            layout="program", image_command=("/tgi-entrypoint.sh",))

    def space(self, ctx: SpaceContext) -> list[Param]:
        mml = ctx.effective_max_model_len
        prefill = tuple(v for v in (2048, 4096, 8192, 16384, 32768) if v < 2 * max(mml, 2048))
        params = [
            Param("max_concurrent_requests", "int", low=16, high=1024, log=True,
                  help="requests admitted at once (more are refused, not queued)"),
            Param("max_batch_prefill_tokens", "choice", choices=prefill,
                  help="token budget of one prefill batch"),
            Param("waiting_served_ratio", "float", low=0.3, high=2.0, step=0.1,
                  help="waiting/running ratio at which prefills join the batch"),
            Param("max_waiting_tokens", "int", low=5, high=100, log=True,
                  help="decode steps before waiting requests are forced in"),
            Param("cuda_memory_fraction", "float", low=0.80, high=1.0, step=0.01,
                  help="fraction of GPU memory TGI may use"),
        ]
        shards = _valid_shards(ctx)
        if len(shards) > 1:
            params.append(Param("num_shard", "choice", choices=tuple(shards),
                                help="tensor-parallel shards"))
        fp8 = not ctx.exact and bool(ctx.host.gpus) and all(
            _cc(g.compute_capability) >= (8, 9) for g in ctx.host.gpus)
        if fp8:
            kv = ((ctx.engine_args or {}).get("kv_cache_dtype") or {}).get("choices")
            if ctx.engine_args is None or (kv and "fp8_e4m3fn" in kv):
                params.append(Param("kv_cache_dtype", "choice", choices=("auto", "fp8_e4m3fn"),
                                    help="KV cache precision (auto: the model's)"))
            if not ctx.model.config.get("quantization_config"):
                params.append(Param("quantize", "choice", choices=("none", "fp8"),
                                    help="weights quantized to fp8 at load"))
        if ctx.engine_args is not None:
            params = [p for p in params if p.name in ctx.engine_args]
        return params

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        n = len(ctx.host.gpus)
        if n > 1 and n in _valid_shards(ctx):
            # what the launcher does by itself, said so the profile and a
            # deploy count the GPUs it takes
            return {"num_shard": n}, f"TGI's default shards over all {n} GPUs"
        return {}, None

    rank_params = ("num_shard",)

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        out = []
        total = params.get("max_total_tokens", ctx.max_model_len)
        inp = params.get("max_input_tokens")
        if inp is not None and total is not None and int(inp) >= int(total):
            out.append(f"max_input_tokens ({inp}) must be < max_total_tokens ({total})")
        batch_total = params.get("max_batch_total_tokens")
        prefill = params.get("max_batch_prefill_tokens")
        if batch_total is not None:
            if total is not None and int(total) > int(batch_total):
                out.append(f"max_total_tokens ({total}) > max_batch_total_tokens "
                           f"({batch_total})")
            if prefill is not None and int(prefill) > int(batch_total):
                out.append(f"max_batch_prefill_tokens ({prefill}) > "
                           f"max_batch_total_tokens ({batch_total})")
        if prefill is not None and inp is not None and int(prefill) < int(inp) \
                and not _chunks(ctx):
            out.append(f"max_batch_prefill_tokens ({prefill}) < max_input_tokens ({inp})")
        if ctx.model.tokenizer_dir != ctx.model.path:
            out.append("TGI reads the tokenizer from the model folder; this model's "
                       f"is in {ctx.model.tokenizer_dir}")
        if ctx.model.load_format == "dummy":
            out.append("TGI has no random-weights load format: the model needs real weights")
        shards = params.get("num_shard")
        if shards is not None and int(shards) > max(len(ctx.host.gpus), 1):
            out.append(f"num_shard ({shards}) > {len(ctx.host.gpus)} GPUs")
        elif shards is not None and int(shards) not in _valid_shards(ctx):
            out.append(f"num_shard {shards} does not divide the attention heads")
        return out

    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        m = ctx.model
        # TGI takes the tokenizer from the model folder (a separate one is
        # not supported) and lists the model by its --model-id.
        argv = [ctx.install.location or _LAUNCHER, "--model-id", str(m.path),
                "--hostname", host, "--port", str(port)]
        if ctx.max_model_len and "max_total_tokens" not in params:
            argv += ["--max-total-tokens", str(ctx.max_model_len)]
        args = ctx.engine_args or {}
        for name, value in sorted(params.items()):
            if self.leaves_out(name, value):
                continue  # the model's own dtype: the option left out
            info = args.get(name)
            flag = info["flag"] if info else "--" + name.replace("_", "-")
            if info and info["kind"] == "flag":
                argv += [flag] if value else []
            elif isinstance(value, bool):
                argv += [flag, str(value).lower()]
            else:
                argv += [flag, str(value)]
        return LaunchSpec(argv=tuple(argv), env={"HF_HUB_OFFLINE": "1"}, host=host,
                          port=port, served_model=str(m.path), fatal_patterns=_FATAL)

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, _FAILURES)

    def memory_asks(self, failure_detail: str) -> tuple[str, ...]:
        if any(re.search(p, failure_detail) for p in _OVER_REQUEST):
            return ("max_batch_prefill_tokens",)
        return ()


def _chunks(ctx: SpaceContext) -> bool:
    """TGI 3 runs chunked prefill with its flashinfer/flashdecoding
    attention (the default on CUDA), where a prompt may exceed the prefill
    budget; that is the launcher's choice at start, so assume it on a GPU."""
    return bool(ctx.host.gpus)


def _valid_shards(ctx: SpaceContext) -> list[int]:
    n_gpus = max(len(ctx.host.gpus), 1)
    heads, kv = ctx.model.num_heads, ctx.model.num_kv_heads
    out = [n for n in range(1, n_gpus + 1) if not heads % n
           and (not kv or kv % n == 0 or n % kv == 0)]
    return out or [1]


def _cc(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)
