"""Hugging Face ``transformers serve`` adapter: search space, launch command,
failure classes.

Facts used here (Transformers 5.19, ``transformers/cli/serve.py`` and
``cli/serving/``; checked against the real server on the embedded
SmolLM2-135M, CPU):
- ``transformers serve MODEL`` is a click command (Transformers' CLI app is
  Hugging Face Hub's typer-based group); its options, types and defaults are
  read from the installed version.  The model is the command's positional
  argument (it is preloaded and pinned), so the word before it is ``serve``.
  The CLI is started as ``python -m transformers.cli.transformers``.
- ``--continuous-batching`` turns on paged-attention continuous batching;
  without it requests are generated one ``generate()`` call each.  qtune
  always turns it on: it is the serving mode worth tuning.  Its knobs are
  the ``--cb-*`` options (``ContinuousBatchingConfig``).
- The KV cache takes ``--cb-max-memory-percent`` (0.9 when unset) of the
  memory left after the model: on CPU, of the host's whole RAM (psutil's
  total less the server's RSS; a 23 GiB host saw a 20 GiB server).  So on
  CPU it is sized by ``--cb-num-blocks`` instead, always.  The attention
  masks come on top, ``max_batch_tokens`` x (cache tokens + it) elements
  each: 728 blocks (4.3 GB of cache) made an 8 GB server at the default
  8192 batch tokens, so the CPU cache stays small.
- On CPU torch runs the model on as many threads as there are cores, and
  its OpenMP threads spin while they wait: with the API server, the
  batching loop and anything else on the host wanting a core, a step
  waits for the slowest thread.  On the shared 2-core test host 8 streamed
  tokens took 5-13 s with 2 threads and 0.7-0.8 s with
  ``OMP_NUM_THREADS=1``: the thread count is searched, and seeded at half
  the cores.
- Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (streamed
  chunks, the last one carrying ``usage``), ``/health``.  ``/v1/models``
  lists the Hugging Face cache, not the served model (a 500 without a
  cache), so readiness is ``/health`` alone, which answers once the model is
  loaded.  A request's ``model`` must be the exact name the server was given
  (the folder path); there is no served-model-name option.
- A request with a field outside the OpenAI schema (``ignore_eos``) is
  refused with 422; a fixed output length is asked by a ``generation_config``
  (JSON) whose ``eos_token_id`` is -1 ("no EOS").
- No ``/metrics``, no prefix-cache counters and no way to empty the cache
  (``/reset`` unloads the model), though continuous batching shares full
  KV blocks between prompts (``allow_block_sharing``, not a CLI option):
  qtune's prompts are fresh for every phase, and each run's summary says
  that no hit rate checked it.  No ``logprobs`` either: quality is not
  measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from qtune.engines.base import (
    CommandWords,
    Engine,
    Failure,
    LaunchSpec,
    Param,
    SpaceContext,
    classify_by_patterns,
    engine_json,
    to_flag,
)
from qtune.estimate import kv_bytes_per_token
from qtune.host.installed import Detect, EngineInstall, PythonFacts

_CLI_MODULE = "transformers.cli.transformers"
_PAGE_TOKENS = 256  # ContinuousBatchingConfig.page_size's default

# Root-cause lines → failure class (uvicorn's bind error, torch's and the
# allocator's out-of-memory, click's usage errors, the loader's).
_FAILURES: list[tuple[str, str]] = [
    (r"(?i)address already in use", "port_in_use"),
    (r"(?:CUDA )?[Oo]ut of memory|OutOfMemoryError|Cannot allocate memory|"
     r"DefaultCPUAllocator: can't allocate", "oom"),
    (r"Missing dependencies for serving", "environment"),
    (r"No such option|Invalid value for|Got unexpected extra argument", "invalid_config"),
    (r"not supported for continuous batching", "invalid_config"),
    (r"does not appear to have a file named|Can't load|is not a local folder|"
     r"No such file", "environment"),
    (r"ValueError: .*", "invalid_config"),
]
# After this uvicorn never serves, though the process may still be exiting.
_FATAL = (r"error while attempting to bind on address",)
_MEMORY_ASKS = ("cb_num_blocks", "cb_max_memory_percent")

# {dest: {flag, kind, default, choices, negative}} of the installed CLI.
_SCRIPT = r"""
import json, click
from transformers import __version__ as version
from transformers.cli.transformers import app
if not isinstance(app, click.Command):  # a plain typer.Typer (older hub)
    import typer
    app = typer.main.get_command(app)
out = {}
for p in app.commands["serve"].params:
    if not isinstance(p, click.Option):
        continue
    t = p.type
    if p.is_flag or isinstance(t, click.types.BoolParamType):
        kind = "flag"
    elif isinstance(t, click.Choice):
        kind = "choice"
    elif isinstance(t, click.types.IntParamType):
        kind = "int"
    elif isinstance(t, click.types.FloatParamType):
        kind = "float"
    else:
        kind = "str"
    d = getattr(p.default, "value", p.default)
    d = d if isinstance(d, (int, float, str, bool, type(None))) else None
    out[p.name] = {"flag": p.opts[0], "kind": kind, "default": d,
                   "choices": [getattr(c, "value", c) for c in t.choices]
                   if isinstance(t, click.Choice) else None,
                   "negative": (p.secondary_opts or [None])[0]}
print("QTUNE-ARGS" + json.dumps({"version": version, "args": out}, default=str))
"""


def read_serve_args(install: EngineInstall, timeout: float = 120.0) -> dict[str, Any] | None:
    """The installed ``transformers serve`` options, cached per version;
    None when they cannot be read (the adapter then uses its 5.19 facts)."""
    data = engine_json(install, f"transformers-{install.version}-serve-args-v1.json",
                       _SCRIPT, timeout)
    args: dict[str, Any] | None = data.get("args") if isinstance(data, dict) else None
    return args


class Transformers(Engine):
    name = "transformers"
    # `transformers serve` needs its [serving] extras (FastAPI, uvicorn, openai)
    detect = Detect(("transformers",), "transformers", needs=("fastapi", "uvicorn", "openai"))

    def find_install(self, facts: PythonFacts | None,
                     python: str) -> tuple[EngineInstall | None, list[str]]:
        install, notes = super().find_install(facts, python)
        found = facts.found.get(self.name) if facts is not None else None
        if found is not None and found.missing:
            notes.append(f"transformers {found.version} found but "
                         f"{', '.join(found.missing)} missing: `transformers serve` cannot "
                         "start (pip install 'transformers[serving]')")
        return install, notes

    def read_args(self, install: EngineInstall) -> dict[str, Any] | None:
        return read_serve_args(install)

    def install_hint(self) -> str:
        return ("pip install 'transformers[serving]' in the engine's environment, or "
                "pass --engine-python PATH of the Python it is in")

    def command_words(self) -> CommandWords:
        # the model is serve's positional argument: the word before it is
        # "serve"; the tokenizer is the model folder's own
        return CommandWords(model=("serve",), tokenizer=())

    def request_fields(self) -> dict[str, Any]:
        # ignore_eos is refused (422); an EOS id of -1 matches no token
        return {"generation_config": json.dumps({"eos_token_id": -1})}

    def memory_asks(self, failure_detail: str) -> tuple[str, ...]:
        if "emory" in failure_detail or "allocate" in failure_detail:
            return _MEMORY_ASKS
        return ()

    def space(self, ctx: SpaceContext) -> list[Param]:
        params = [
            Param("cb_max_batch_tokens", "choice", choices=(512, 1024, 2048, 4096, 8192),
                  help="most tokens (prefill and decode) in one forward pass"),
            # "eager" runs as paged|eager; sdpa is what the model loads with
            Param("attn_implementation", "choice", choices=("sdpa", "eager"),
                  help="attention kernel under continuous batching"),
            Param("compile", "bool", opt_in=True,
                  help="torch.compile the model (minutes of compile at each start)"),
            Param("cb_block_size", "choice", choices=(64, 128, 256), opt_in=True,
                  help="KV cache page in tokens (deprecated in 5.17, read as page_size)"),
        ]
        if ctx.host.gpus:
            params += [
                Param("cb_max_memory_percent", "float", low=0.5, high=0.95, step=0.05,
                      help="fraction of the free GPU memory for the KV cache"),
                Param("cb_use_cuda_graph", "bool", help="replay batches from CUDA graphs"),
            ]
        else:
            lo, hi = _cpu_blocks_range(ctx)
            params += [
                Param("cb_num_blocks", "int", low=lo, high=hi, log=True,
                      help=f"KV cache size in blocks of {_PAGE_TOKENS} tokens (CPU)"),
                # the folder's weights are bfloat16; CPUs without bf16 units
                # run float32 faster (not lossy: every bf16 value is exact)
                Param("dtype", "choice", choices=("auto", "float32"),
                      help="weights' dtype (auto: the model's)"),
            ]
            cpus = _cpus(ctx)
            if cpus > 1:
                params.append(Param("OMP_NUM_THREADS", "int", low=1, high=cpus,
                                    target="env", help="torch's threads (default: "
                                    "one per core)"))
        if ctx.engine_args is not None:
            params = [p for p in params if p.target == "env" or p.name in ctx.engine_args]
        return params

    def seeds(self, params: list[Param], ctx: SpaceContext,
              fixed: Mapping[str, Any] | None = None) -> list[tuple[dict[str, Any], str]]:
        if not any(p.name == "OMP_NUM_THREADS" for p in params):
            return []
        half = max(1, _cpus(ctx) // 2)
        return [({"OMP_NUM_THREADS": half},
                 f"{half} torch thread(s) of {_cpus(ctx)} cores: the rest left to the "
                 "API server and the batching loop (spinning threads wait for the slowest)")]

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        if ctx.host.gpus:
            return {}, None
        blocks = _cpu_default_blocks(ctx)
        return {"cb_num_blocks": blocks}, (
            f"engine default KV cache (0.9 of the host's RAM) would take the host; "
            f"baseline uses {blocks} blocks of {_PAGE_TOKENS} tokens")

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        out = []
        if not ctx.model.has_weights:
            out.append("transformers serve loads real weights (the model folder has "
                       "none: a shape-only model cannot be served)")
        blocks = params.get("cb_num_blocks")
        if blocks is not None:
            page = int(params.get("cb_block_size") or _PAGE_TOKENS)
            if int(blocks) * page < ctx.effective_max_model_len:
                out.append(f"cb_num_blocks {blocks} x {page} tokens holds less than one "
                           f"{ctx.effective_max_model_len}-token sequence")
        return out

    def launch_spec(
        self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str, port: int
    ) -> LaunchSpec:
        m = ctx.model
        argv = [ctx.install.python or "python3", "-m", _CLI_MODULE, "serve", str(m.path),
                "--continuous-batching"]
        # one device ("auto" would spread the model over every GPU it sees)
        argv += ["--device", "cuda" if ctx.host.gpus else "cpu"]
        argv += ["--host", host, "--port", str(port)]
        env = {"HF_HUB_OFFLINE": "1"}
        if ctx.install.pythonpath:
            env["PYTHONPATH"] = ctx.install.pythonpath
        values = dict(params)
        if not ctx.host.gpus and "cb_num_blocks" not in values:
            # never the engine default on CPU (see the module docstring)
            values["cb_num_blocks"] = _cpu_default_blocks(ctx)
        args = ctx.engine_args or {}
        for name, value in sorted(values.items()):
            if name.isupper():
                env[name] = str(value)
                continue
            argv += to_flag(name, value, args.get(name))
        # The request names the model as the server was given it.
        return LaunchSpec(argv=tuple(argv), env=env, host=host, port=port,
                          served_model=str(m.path), models_path=None,
                          fatal_patterns=_FATAL)

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, _FAILURES)


def _cpus(ctx: SpaceContext) -> int:
    return len(ctx.host.usable_cpus) or ctx.host.cpu.logical_cpus


def _block_bytes(ctx: SpaceContext) -> int:
    return max(1, kv_bytes_per_token(ctx.model.config) * _PAGE_TOKENS)


def _cpu_blocks_range(ctx: SpaceContext) -> tuple[int, int]:
    """Blocks for one sequence of the context length, up to a cache of an
    eighth of the free memory, at most 4 GiB (the masks at least double
    what the cache takes: see the module docstring)."""
    lo = max(1, math.ceil(ctx.effective_max_model_len / _PAGE_TOKENS))
    budget = min(4 * 2**30, ctx.host.memory.available / 8)
    return lo, max(lo, int(budget // _block_bytes(ctx)))


def _cpu_default_blocks(ctx: SpaceContext) -> int:
    """The baseline's cache: 1 GiB, or less on a host with little free."""
    lo, hi = _cpu_blocks_range(ctx)
    return max(lo, min(hi, int(2**30 // _block_bytes(ctx))))
