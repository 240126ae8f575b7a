"""The SGLang adapter against SGLang 0.5.17's own material: its server
arguments as its argparse gave them, its --help, the /metrics text its own
collectors render, and its log lines (tests/engines/fixtures/README.md)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest

from qtune.engines import get_engine
from qtune.engines import probe_host as probe
from qtune.engines.base import LoadView, SpaceContext
from qtune.engines.sglang import SGLang
from qtune.host.installed import EngineInstall
from qtune.load.prometheus import MetricsWatcher, parse
from qtune.model import resolve_model
from tests.engines.conftest import ENG_FIX, H200X2, replay_nvml
from tests.fakes.model import make_model

ARGS = json.loads((ENG_FIX / "sglang-0.5.17-server-args.json").read_text())
HELP = (ENG_FIX / "sglang-0.5.17-help.txt").read_text()
METRICS = (ENG_FIX / "sglang-0.5.17-metrics.txt").read_text()


@pytest.fixture
def gpu_ctx(tmp_path):
    host = probe(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable)
    model = resolve_model(str(make_model(tmp_path / "qwen3-4b")))
    install = EngineInstall("sglang", "0.5.17", "cuda", "/opt/sg/bin/python")
    return SpaceContext(host, model, install, engine_args=ARGS)


def test_the_captured_arguments_are_the_help_s():
    """The JSON (from argparse's actions) and the help text are the same
    parser: every option the help lists is in the JSON (the JSON also has
    the options whose help SGLang suppresses)."""
    assert len(ARGS) > 400
    known = {f for i in ARGS.values() for f in (i["flag"], *i["aliases"])}
    listed = set(re.findall(r"^  (--[a-z0-9-]+)", HELP, re.M))
    assert len(listed) > 400 and listed <= known
    assert ARGS["cuda_graph_max_bs_decode"]["aliases"] == ["--cuda-graph-max-bs"]
    assert "--model" in ARGS["model_path"]["aliases"]


def test_the_space_has_the_issue_s_flags_under_this_version_s_names(gpu_ctx):
    space = {p.name: p for p in SGLang().space(gpu_ctx)}
    for name in ("mem_fraction_static", "max_running_requests", "chunked_prefill_size",
                 "max_prefill_tokens", "schedule_policy", "schedule_conservativeness",
                 "cuda_graph_max_bs_decode", "tp_size", "dp_size", "kv_cache_dtype",
                 "quantization", "disable_radix_cache", "enable_mixed_chunk",
                 "stream_interval"):
        assert name in space, name
        assert name in ARGS, name  # a real dest of 0.5.17
    assert space["tp_size"].choices == (1, 2) and space["dp_size"].choices == (1, 2)
    # choices are the installed version's own spellings
    assert set(space["kv_cache_dtype"].choices) <= set(ARGS["kv_cache_dtype"]["choices"])
    assert set(space["schedule_policy"].choices) <= set(ARGS["schedule_policy"]["choices"])


def test_an_older_version_s_names_are_used_where_it_has_them(gpu_ctx):
    """Older releases name the decode graph limit --cuda-graph-max-bs (dest
    cuda_graph_max_bs); a flag the version lacks never appears."""
    old = {k: v for k, v in ARGS.items()
           if k not in ("cuda_graph_max_bs_decode", "enable_mixed_chunk")}
    old["cuda_graph_max_bs"] = dict(ARGS["cuda_graph_max_bs_decode"],
                                    flag="--cuda-graph-max-bs", aliases=[])
    ctx = dataclasses.replace(gpu_ctx, engine_args=old)
    names = {p.name for p in SGLang().space(ctx)}
    assert "cuda_graph_max_bs" in names and "cuda_graph_max_bs_decode" not in names
    assert "enable_mixed_chunk" not in names
    argv = SGLang().launch_spec({"cuda_graph_max_bs": 128}, ctx, host="h", port=1).argv
    assert "--cuda-graph-max-bs" in argv
    assert "--model" in argv  # the alias this parser has
    old["model_path"] = dict(ARGS["model_path"], aliases=[])
    argv = SGLang().launch_spec({}, ctx, host="h", port=1).argv
    assert "--model-path" in argv and "--model" not in argv


def test_exact_leaves_out_the_lossy_options(gpu_ctx):
    names = {p.name for p in SGLang().space(dataclasses.replace(gpu_ctx, exact=True))}
    assert not names & {"kv_cache_dtype", "quantization"}


def test_launch_command_parses_with_sglang_s_own_flags(gpu_ctx):
    params = {"mem_fraction_static": 0.85, "disable_radix_cache": True,
              "enable_mixed_chunk": False, "schedule_policy": "lpm",
              "cuda_graph_max_bs_decode": 256, "tp_size": 2, "quantization": "none"}
    spec = SGLang().launch_spec(params, gpu_ctx, host="127.0.0.1", port=30001)
    argv = list(spec.argv)
    assert argv[:3] == ["/opt/sg/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model") + 1] == str(gpu_ctx.model.path)
    assert "--enable-metrics" in argv and "--disable-radix-cache" in argv
    assert "--enable-mixed-chunk" not in argv and "--quantization" not in argv
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "256"
    # every flag is one the captured parser knows (by name or alias)
    known = {f for i in ARGS.values() for f in (i["flag"], *i["aliases"])}
    assert {w for w in argv if w.startswith("--")} <= known
    assert spec.served_model == gpu_ctx.model.served_name


def test_hard_constraints(gpu_ctx):
    e = SGLang()
    assert e.check({"chunked_prefill_size": 4096, "tp_size": 2, "dp_size": 1}, gpu_ctx) == []
    assert e.check({"chunked_prefill_size": 4096, "page_size": 64}, gpu_ctx) == []
    assert "multiple of page_size" in e.check(
        {"chunked_prefill_size": 4000, "page_size": 64}, gpu_ctx)[0]
    assert "GPUs" in e.check({"tp_size": 2, "dp_size": 2}, gpu_ctx)[-1]
    assert "heads" in e.check({"tp_size": 3}, gpu_ctx)[0]
    assert e.gpus_used({"tp_size": 2, "dp_size": 2}) == 4


# --- failures, from the log lines of 0.5.17's sources -------------------------

LOGS = {
    "oom": [
        "[2026-12-01 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent "
        "call last):\nRuntimeError: Not enough memory. Please try to increase "
        "--mem-fraction-static. Current value: mem_fraction_static=0.7\n"
        "[2026-12-01 10:00:01] Received sigquit from a child process. It usually means "
        "the child failed.",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
        "2.00 GiB\nPossible solutions:\n1. set --mem-fraction-static to a smaller value",
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If "
        "exit code is -9 (SIGKILL), a common cause is the OS OOM killer.",
    ],
    "environment": [
        "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by "
        "other processes. pre_model_load_memory=70.1, local_gpu_memory=139.7",
    ],
    "invalid_config": [
        "usage: sglang serve [-h] --model-path MODEL_PATH\nsglang serve: error: argument "
        "--schedule-policy: invalid choice: 'x' (choose from lpm, random, fcfs)",
    ],
    "port_in_use": ["OSError: [Errno 98] Address already in use"],
    "crash": ["[2026-12-01 10:00:09] Initialization failed. warmup error: Traceback"],
}


@pytest.mark.parametrize("reason,text", [(r, t) for r, ts in LOGS.items() for t in ts])
def test_failures_are_classified_from_sglang_s_log_lines(reason, text):
    assert SGLang().classify(text).reason == reason


def test_the_log_lines_are_sglang_s_own():
    """The strings the patterns match are in 0.5.17's sources as quoted."""
    src = (ENG_FIX / "sglang-0.5.17-log-sources.txt").read_text()
    for line in ("Not enough memory. Please try to increase --mem-fraction-static",
                 "Capture cuda graph failed", "The memory capacity is unbalanced",
                 "Received sigquit from a child process", "scheduler died during initialization",
                 "Initialization failed. warmup error", "fired up and ready to roll"):
        assert line in src, line


def test_a_graph_capture_oom_asks_the_memory_it_failed_with():
    e = SGLang()
    detail = e.classify(LOGS["oom"][1]).detail
    assert "mem_fraction_static" in e.memory_asks(detail)
    # too little memory is not an over-request: a larger fraction may fit
    assert e.memory_asks(e.classify(LOGS["oom"][0]).detail) == ()


# --- metrics: the text SGLang's own collectors render -------------------------

def report_from_zero(snap, names):
    """The server view's report of a run whose counters went from 0 to ``snap``."""
    w = MetricsWatcher("http://x", names)
    w.first = {k: {e: 0.0 for e in v} for k, v in snap.items()}
    w.last = snap
    r = w.report()
    assert r is not None
    return r


def test_metrics_map_onto_the_server_view():
    names = SGLang().metric_names()
    snap = parse(METRICS, names.engine_label)
    assert snap[names.requests_running] == {"0": 37.0}  # by dp_rank
    assert snap[names.requests_waiting] == {"0": 5.0}
    assert snap[names.kv_cache_usage] == {"0": 0.62}
    for counter in (names.preemptions, names.prompt_tokens, names.generation_tokens,
                    names.request_success, names.prefix_cache_hits):
        assert counter in snap, counter
    r = report_from_zero(snap, names)
    assert r["preemptions"] == 2 and r["prompt_tokens"] == 3072
    assert r["generation_tokens"] == 768
    assert r["prefix_cache_hit_rate"] == pytest.approx(1024 / 3072)


def test_registry_and_deploy_hooks():
    e = get_engine("sglang")
    assert isinstance(e, SGLang)
    assert e.image("cuda", "0.5.17") == "lmsysorg/sglang:v0.5.17-cu130-runtime"
    assert e.image("cpu", "0.5.17") is None
    assert e.max_model_len(["p", "-m", "sglang.launch_server", "--context-length", "8192"]) \
        == 8192
    assert e.cache_reset_paths() == ("/flush_cache",)
    assert "sglang" in e.install_hint()


def test_the_arguments_are_read_from_the_installed_parser_and_cached(tmp_path, monkeypatch):
    """The reader runs in the engine's Python against its ServerArgs (here
    a package shaped like sglang's: a deprecated alias added by hand after
    the dataclass's own flags, as 0.5.17 does)."""
    from qtune.engines.sglang import read_server_args

    pkg = tmp_path / "site" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg.parent / "version.py").write_text("__version__ = '0.5.99'\n")
    (pkg / "server_args.py").write_text(
        "class ServerArgs:\n"
        "    @staticmethod\n"
        "    def add_cli_args(p):\n"
        "        p.add_argument('--model-path', '--model', type=str)\n"
        "        p.add_argument('--mem-fraction-static', type=float, default=None)\n"
        "        p.add_argument('--schedule-policy', type=str, default='fcfs',\n"
        "                       choices=['lpm', 'fcfs'])\n"
        "        p.add_argument('--disable-radix-cache', action='store_true')\n"
        "        p.add_argument('--cuda-graph-max-bs-decode', type=int)\n"
        "        p.add_argument('--cuda-graph-max-bs', type=int,\n"
        "                       dest='cuda_graph_max_bs_decode')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    install = EngineInstall("sglang", "0.5.99", "cuda", sys.executable)
    args = read_server_args(install)
    assert args is not None
    assert args["mem_fraction_static"]["kind"] == "float"
    assert args["schedule_policy"] == {"flag": "--schedule-policy", "kind": "choice",
                                       "default": "fcfs", "choices": ["lpm", "fcfs"],
                                       "aliases": []}
    assert args["disable_radix_cache"]["kind"] == "flag"
    assert args["cuda_graph_max_bs_decode"]["aliases"] == ["--cuda-graph-max-bs"]
    assert args["model_path"]["aliases"] == ["--model"]
    # cached per version: the next study does not import SGLang again
    gone = dataclasses.replace(install, python=str(tmp_path / "no-python"))
    assert read_server_args(gone) == args
    assert read_server_args(dataclasses.replace(gone, version="0.5.98")) is None


def test_shape_cuts_what_the_load_cannot_use(gpu_ctx):
    e = SGLang()
    params = e.space(gpu_ctx)
    closed = LoadView(rate=None, concurrency=32, shared_prefix=False)
    out, fixed, notes = e.shape(params, gpu_ctx, closed)
    by = {p.name: p for p in out}
    assert by["max_running_requests"].high == 32 and fixed == {}
    assert by["schedule_policy"].choices == ("fcfs", "lof")
    assert len(notes) == 2
    # an open load whose prompts share prefixes keeps both as they were
    opened = LoadView(rate=8.0, concurrency=None, shared_prefix=True)
    assert e.shape(params, gpu_ctx, opened) == (params, {}, [])
    # no more streams than the smallest limit: nothing left to tune
    _, fixed, _ = e.shape(params, gpu_ctx, LoadView(rate=None, concurrency=8,
                                                    shared_prefix=True))
    assert fixed == {"max_running_requests": 8}


# What a real SGLang 0.5.17 server served on the H200 (benchmarks/gpu-h200/run10-sglang,
# scraped mid-run from the engine defaults' server): labels differ from the rendered
# capture above (no dp_rank, an engine_type and a cache_source label, is_streaming
# on the token counters), and the retraction counter is absent until a first
# retraction; the view must still read every gauge and counter qtune shows.
METRICS_H200 = (ENG_FIX / "sglang-0.5.17-metrics-h200.txt").read_text()


def test_a_real_server_s_metrics_map_onto_the_server_view():
    names = SGLang().metric_names()
    snap = parse(METRICS_H200, names.engine_label)
    assert snap[names.requests_running] == {"": 344.0}
    assert snap[names.requests_waiting] == {"": 0.0}
    assert snap[names.kv_cache_usage] == {"": 0.48}
    # SGLang's own start-up request (6 prompt tokens, not streamed) plus 524 of qtune's
    assert snap[names.prompt_tokens] == {"": 6.0 + 536576.0}
    assert snap[names.prefix_cache_hits] == {"": 15.0}
    assert names.preemptions not in snap
    r = report_from_zero(snap, names)
    assert r["prompt_tokens"] == 536582 and r["generation_tokens"] == 134152
    assert r["prefix_cache_hit_rate"] == pytest.approx(15 / 536582)
    assert r["preemptions"] == 0  # no retraction yet: the counter is not there


def test_the_real_server_s_help_is_the_captured_one():
    """The `--help` of the SGLang installed on the H200 lists the same
    options as the one captured from the wheel, so the space read from the
    wheel is the space the real install offers."""
    real = (ENG_FIX / "sglang-0.5.17-help-h200.txt").read_text()
    opts = set(re.findall(r"^  (--[a-z0-9-]+)", real, re.M))
    assert len(opts) > 400
    assert opts == set(re.findall(r"^  (--[a-z0-9-]+)", HELP, re.M))
