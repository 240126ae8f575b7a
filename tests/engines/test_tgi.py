"""The TGI adapter against the last release's own material (v3.3.7): the
launcher's --help as its docs page holds it, its metric table, and the log
and error lines of its sources (tests/engines/fixtures/README.md).  No TGI
server has run here."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from qtune.engines import get_engine
from qtune.engines import probe_host as probe
from qtune.engines.base import SpaceContext
from qtune.engines.tgi import TGI, parse_help
from qtune.host.installed import EngineInstall
from qtune.load.prometheus import MetricsWatcher, parse
from qtune.model import resolve_model
from tests.engines.conftest import ENG_FIX, H200X2, replay_nvml
from tests.fakes.model import make_model

HELP = (ENG_FIX / "tgi-3.3.7-launcher-help.md").read_text()
ARGS = parse_help(HELP)
SOURCES = (ENG_FIX / "tgi-3.3.7-log-sources.txt").read_text()


@pytest.fixture
def gpu_ctx(tmp_path):
    host = probe(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable)
    # TGI loads real weights, with the tokenizer in the same folder: the
    # model is taken to have both
    m = resolve_model(str(make_model(tmp_path / "qwen3-4b")))
    model = dataclasses.replace(m, has_weights=True, tokenizer_dir=m.path)
    install = EngineInstall("tgi", "3.3.7", "cuda", None, "/usr/local/bin/text-generation-launcher")
    return SpaceContext(host, model, install, max_model_len=8192, engine_args=ARGS)


def test_the_launcher_help_is_read():
    assert ARGS["max_concurrent_requests"] == {
        "flag": "--max-concurrent-requests", "kind": "int", "default": 128, "choices": None}
    assert ARGS["waiting_served_ratio"]["kind"] == "float"
    assert ARGS["waiting_served_ratio"]["default"] == 0.3
    assert ARGS["kv_cache_dtype"]["choices"] == ["fp8_e4m3fn", "fp8_e5m2"]
    # the multi-line "Possible values:" listing
    assert "fp8" in ARGS["quantize"]["choices"] and "awq" in ARGS["quantize"]["choices"]
    assert ARGS["trust_remote_code"]["kind"] == "flag"
    assert ARGS["port"]["flag"] == "--port" and ARGS["port"]["default"] == 3000
    assert ARGS["hostname"]["default"] == "0.0.0.0"
    for name in ("max_batch_prefill_tokens", "max_batch_total_tokens", "max_input_tokens",
                 "max_total_tokens", "max_waiting_tokens", "cuda_memory_fraction",
                 "sharded", "num_shard"):
        assert name in ARGS, name
    assert "help" not in ARGS and "version" not in ARGS


def test_the_space_is_the_installed_launcher_s(gpu_ctx):
    space = {p.name: p for p in TGI().space(gpu_ctx)}
    assert set(space) == {"max_concurrent_requests", "max_batch_prefill_tokens",
                          "waiting_served_ratio", "max_waiting_tokens",
                          "cuda_memory_fraction", "num_shard", "kv_cache_dtype", "quantize"}
    assert space["num_shard"].choices == (1, 2)
    # a launcher without --kv-cache-dtype (before 2.3) gets no such dimension
    old = {k: v for k, v in ARGS.items() if k != "kv_cache_dtype"}
    names = {p.name for p in TGI().space(dataclasses.replace(gpu_ctx, engine_args=old))}
    assert "kv_cache_dtype" not in names


def test_constraints_input_below_total_and_prefill_budgets(gpu_ctx):
    e = TGI()
    assert e.check({"max_batch_prefill_tokens": 4096}, gpu_ctx) == []
    assert "must be < max_total_tokens" in e.check({"max_input_tokens": 8192}, gpu_ctx)[0]
    assert "max_total_tokens (8192) > max_batch_total_tokens" in e.check(
        {"max_batch_total_tokens": 4096}, gpu_ctx)[0]
    assert any("max_batch_prefill_tokens (16384) > max_batch_total_tokens" in v
               for v in e.check({"max_batch_prefill_tokens": 16384,
                                 "max_batch_total_tokens": 10000}, gpu_ctx))
    # without a GPU (no chunked prefill) one prefill batch must hold a prompt
    cpu = dataclasses.replace(gpu_ctx, host=dataclasses.replace(
        gpu_ctx.host, gpu=dataclasses.replace(gpu_ctx.host.gpu, gpus=[])))
    assert "max_batch_prefill_tokens (2048) < max_input_tokens (4000)" in e.check(
        {"max_batch_prefill_tokens": 2048, "max_input_tokens": 4000}, cpu)[0]
    assert "GPUs" in e.check({"num_shard": 4}, gpu_ctx)[0]


def test_random_weights_or_a_tokenizer_elsewhere_are_refused_before_a_launch(
        gpu_ctx, tmp_path):
    dummy = dataclasses.replace(gpu_ctx.model, has_weights=False)
    assert "random-weights" in TGI().check({}, dataclasses.replace(gpu_ctx, model=dummy))[0]
    apart = dataclasses.replace(gpu_ctx.model, tokenizer_dir=tmp_path / "tok")
    assert "tokenizer" in TGI().check({}, dataclasses.replace(gpu_ctx, model=apart))[0]


def test_defaults_shard_over_every_gpu_and_say_so(gpu_ctx):
    params, note = TGI().baseline(gpu_ctx)
    assert params == {"num_shard": 2} and note and "2 GPUs" in note
    assert TGI().gpus_used(params) == 2


def test_launch_command_uses_the_launcher_s_flags(gpu_ctx):
    spec = TGI().launch_spec({"num_shard": 2, "quantize": "none", "kv_cache_dtype": "fp8_e4m3fn",
                              "waiting_served_ratio": 1.2}, gpu_ctx,
                             host="127.0.0.1", port=3001)
    argv = list(spec.argv)
    assert argv[0] == "/usr/local/bin/text-generation-launcher"
    assert argv[argv.index("--hostname") + 1] == "127.0.0.1"
    assert argv[argv.index("--max-total-tokens") + 1] == "8192"
    assert "--quantize" not in argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3fn"
    known = {i["flag"] for i in ARGS.values()}
    assert {w for w in argv if w.startswith("--")} <= known
    assert spec.served_model == str(gpu_ctx.model.path)
    assert TGI().max_model_len(argv) == 8192


LOGS = {
    "invalid_config": [
        'Error: ArgumentValidation("`max_input_tokens`(8192) must be < '
        '`max_total_tokens`(8192)")',
        "ERROR text_generation_router: Error: ArgumentValidation(\"`max_batch_prefill_tokens` "
        "must be >= `max_input_tokens`. Given: 2048 and 4095\")",
        'Error: NotEnoughCUDADevices("`sharded` is true but only found 1 CUDA devices") '
        "not enough cuda devices",
    ],
    "oom": [
        "ERROR text_generation_launcher: Method Warmup encountered an error.\n"
        "RuntimeError: Not enough memory to handle 16384 prefill tokens. You need to "
        "decrease `--max-batch-prefill-tokens`\nERROR text_generation_launcher: "
        "Shard 0 failed to start",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ],
    "environment": ["ERROR shard-manager: text_generation_launcher: text-generation-server "
                    "not found in PATH"],
    "crash": ["ERROR text_generation_launcher: Shard 1 crashed\nError: ShardFailed"],
}


@pytest.mark.parametrize("reason,text", [(r, t) for r, ts in LOGS.items() for t in ts])
def test_failures_are_classified_from_tgi_s_lines(reason, text):
    assert TGI().classify(text).reason == reason


def test_the_lines_are_tgi_s_own():
    for line in ("must be < `max_total_tokens`", "must be >= `max_input_tokens`",
                 "Not enough memory to handle {num_tokens} prefill tokens",
                 "text-generation-server not found in PATH", "Shard {rank} failed to start",
                 "Shard {rank} crashed", "not enough cuda devices"):
        assert line in SOURCES, line


def test_a_prefill_warmup_oom_asks_its_prefill_budget():
    e = TGI()
    assert e.memory_asks(e.classify(LOGS["oom"][0]).detail) == ("max_batch_prefill_tokens",)
    assert e.memory_asks(e.classify(LOGS["oom"][1]).detail) == ()


def test_metrics_map_onto_the_server_view_and_say_what_tgi_lacks():
    names = TGI().metric_names()
    table = (ENG_FIX / "tgi-3.3.7-metrics.md").read_text()
    for n in (names.requests_waiting, names.requests_running, names.request_success,
              names.prompt_tokens.removesuffix("_sum"),
              names.generation_tokens.removesuffix("_sum")):
        assert f"`{n}`" in table, n
    assert names.kv_cache_usage is None and names.preemptions is None
    snap = parse((ENG_FIX / "tgi-3.3.7-metrics-sample.txt").read_text())
    w = MetricsWatcher("http://x", names)
    w.first, w.last = {}, snap
    w.peaks = {names.requests_running: 24.0}
    r = w.report()
    assert r is not None
    assert r["prompt_tokens"] == 10240 and r["generation_tokens"] == 2560
    assert r["running_peak"] == 24.0
    # not reported by TGI: not measured, never 0
    assert r["preemptions"] is None and r["kv_cache_usage_peak"] is None
    assert r["prefix_cache_hit_rate"] is None and r["prefix_cache_queries"] is None


def test_registry_image_and_hint():
    e = get_engine("tgi")
    assert e.image("cuda", "3.3.7") == "ghcr.io/huggingface/text-generation-inference:3.3.7"
    assert e.image("rocm", "3.3.7").endswith(":3.3.7-rocm")
    assert "text-generation-server" in e.install_hint()
    assert "has not run" in e.install_hint()


def test_the_installed_launcher_s_help_is_read(tmp_path):
    launcher = tmp_path / "text-generation-launcher"
    launcher.write_text(f"#!/bin/sh\ncat '{ENG_FIX / 'tgi-3.3.7-launcher-help.md'}'\n")
    launcher.chmod(0o755)
    install = EngineInstall("tgi", "3.3.7", "cuda", None, str(launcher))
    assert TGI().read_args(install) == ARGS
    assert TGI().read_args(dataclasses.replace(
        install, location=str(tmp_path / "missing"))) is None
