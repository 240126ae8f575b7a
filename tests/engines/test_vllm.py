from __future__ import annotations

import dataclasses

import pytest

from qtune.engines import ENGINES, get_engine
from qtune.engines.vllm import VLLM, to_flag
from qtune.errors import InputError
from tests.conftest import FIX


def test_get_engine_lists_choices():
    with pytest.raises(InputError) as e:
        get_engine("vlm")
    assert "vllm" in e.value.hint


def test_cpu_space_has_kv_space_within_memory(cpu_ctx):
    space = {p.name: p for p in VLLM().space(dataclasses.replace(cpu_ctx,
                                                                 max_model_len=4096))}
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
            "enable_prefix_caching", "VLLM_CPU_KVCACHE_SPACE"} <= set(space)
    assert "stream_interval" not in space  # measured: no effect on this target
    kv = space["VLLM_CPU_KVCACHE_SPACE"]
    assert kv.target == "env"
    assert kv.high * 2**30 <= cpu_ctx.host.memory.available
    assert "gpu_memory_utilization" not in space


def test_gpu_space_tp_divides_heads(cpu_ctx):
    from qtune.host.gpu import GPU, GPUReport

    gpus = [GPU(i, "NVIDIA H200", f"GPU-{i}", 150 * 2**30, 150 * 2**30, "9.0",
                f"0000:0{i}:00.0", 0, [], 5, 16, 5, 16) for i in range(3)]
    host = dataclasses.replace(cpu_ctx.host, gpu=GPUReport(gpus, "580", "13.0", None))
    ctx = dataclasses.replace(
        cpu_ctx, host=host,
        install=dataclasses.replace(cpu_ctx.install, build="cuda"))
    space = {p.name: p for p in VLLM().space(ctx)}
    # 32 heads, 8 KV heads, 3 GPUs: tp 3 does not divide 32.
    assert space["tensor_parallel_size"].choices == (1, 2)
    assert space["kv_cache_dtype"].choices == ("auto", "fp8")
    assert space["quantization"].choices == ("none", "fp8")
    assert space["stream_interval"].choices[0] == 1  # the engine default first
    assert "VLLM_CPU_KVCACHE_SPACE" not in space
    assert VLLM().check({"tensor_parallel_size": 3}, ctx)
    # One engine per GPU is offered too, up to the GPUs there are.
    assert space["data_parallel_size"].choices == (1, 2)
    assert not VLLM().check({"tensor_parallel_size": 1, "data_parallel_size": 2}, ctx)
    assert VLLM().check({"tensor_parallel_size": 2, "data_parallel_size": 2}, ctx) == [
        "tensor x pipeline x data parallel sizes (4) > 3 GPUs"]
    assert VLLM().gpus_used({"tensor_parallel_size": 2, "data_parallel_size": 2}) == 4
    # A pipeline the user fixed takes GPUs too.
    assert VLLM().gpus_used({"pipeline_parallel_size": 2, "data_parallel_size": 2}) == 4
    assert VLLM().check({"pipeline_parallel_size": 2, "data_parallel_size": 2}, ctx) == [
        "tensor x pipeline x data parallel sizes (4) > 3 GPUs"]
    # The first tuned trial: the defaults with one replica per GPU (2 of 3:
    # replicas come in powers of two).
    assert [p for p, _ in VLLM().seeds(list(space.values()), ctx)] == [
        {"data_parallel_size": 2}]
    assert VLLM().seeds(VLLM().space(cpu_ctx), cpu_ctx) == []
    # With TP fixed at 2 on 3 GPUs no second replica fits: no seed, rather
    # than one that fails check.
    assert VLLM().seeds(list(space.values()), ctx, {"tensor_parallel_size": 2}) == []


def test_seed_fills_the_gpus_around_a_fixed_tensor_parallel_size(cpu_ctx):
    from qtune.host.gpu import GPU, GPUReport

    gpus = [GPU(i, "NVIDIA H200", f"GPU-{i}", 150 * 2**30, 150 * 2**30, "9.0",
                f"0000:0{i}:00.0", 0, [], 5, 16, 5, 16) for i in range(8)]
    host = dataclasses.replace(cpu_ctx.host, gpu=GPUReport(gpus, "580", "13.0", None))
    ctx = dataclasses.replace(cpu_ctx, host=host,
                              install=dataclasses.replace(cpu_ctx.install, build="cuda"))
    params = [p for p in VLLM().space(ctx) if p.name != "tensor_parallel_size"]
    (point, why), = VLLM().seeds(params, ctx, {"tensor_parallel_size": 2})
    assert point == {"data_parallel_size": 4} and "one per 2 GPUs" in why
    assert not VLLM().check({**point, "tensor_parallel_size": 2}, ctx)
    assert VLLM().seeds(params, ctx)[0][0] == {"data_parallel_size": 8}
    # A fixed pipeline takes GPUs per replica too: tp 2 x pp 2 leaves 2 replicas.
    fixed = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    (point, why), = VLLM().seeds(params, ctx, fixed)
    assert point == {"data_parallel_size": 2} and "one per 4 GPUs" in why
    assert not VLLM().check({**point, **fixed}, ctx)


def test_tp_pins_an_allreduce_without_multicast_where_the_host_forbids_it(
        cpu_ctx):
    from qtune.host.gpu import GPU, GPUReport

    gpus = [GPU(i, "NVIDIA H200", f"GPU-{i}", 150 * 2**30, 150 * 2**30, "9.0",
                f"0000:0{i}:00.0", 0, [], 5, 16, 5, 16) for i in range(2)]
    host = dataclasses.replace(cpu_ctx.host, gpu=GPUReport(gpus, "580", "13.0", None))
    comm: dict[str, str] = {}  # the probe's view of qtune's environment

    def ctx():
        return dataclasses.replace(cpu_ctx, host=dataclasses.replace(host, comm_env=comm),
                                   install=dataclasses.replace(cpu_ctx.install, build="cuda"))

    def env(params):
        return VLLM().launch_spec(params, ctx(), host="127.0.0.1", port=1).env

    def argv(params, fields=("fuse_allreduce_rms",)):  # with the installed vLLM's facts
        args = {"compilation_config": {"flag": "--compilation-config", "kind": "str",
                                       "pass_config_fields": list(fields)}}
        c = dataclasses.replace(ctx(), engine_args=args)
        return VLLM().launch_spec(params, c, host="127.0.0.1", port=1).argv

    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in env({"tensor_parallel_size": 2})
    comm["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    assert env({"tensor_parallel_size": 2})["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"
    # Where the installed vLLM names the fused all-reduce pass, it is turned
    # off (trtllm hung at start on that host); an older vLLM only gets the pin.
    off = '{"pass_config":{"fuse_allreduce_rms":false}}'
    a = argv({"tensor_parallel_size": 2})
    assert a[a.index("--compilation-config") + 1] == off
    assert "--compilation-config" not in argv({"tensor_parallel_size": 2}, fields=())
    assert "--compilation-config" not in argv({"tensor_parallel_size": 1})
    # The user's own compilation config is merged into, not doubled or lost;
    # an explicit choice of the pass is theirs.
    a = argv({"tensor_parallel_size": 2, "compilation_config": '{"mode": 3}'})
    assert a.count("--compilation-config") == 1
    assert a[a.index("--compilation-config") + 1] == (
        '{"mode":3,"pass_config":{"fuse_allreduce_rms":false}}')
    mine = '{"pass_config": {"fuse_allreduce_rms": true}}'
    a = argv({"tensor_parallel_size": 2, "compilation_config": mine})
    assert '"fuse_allreduce_rms":true' in a[a.index("--compilation-config") + 1]
    # The host's own setting travels with the profile (a unit or container
    # does not inherit the shell's environment).
    assert env({"tensor_parallel_size": 2})["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in env({"data_parallel_size": 2})
    # Any launch over several GPUs keeps them (run 6's two-replica unit had
    # lost them); one GPU needs none.
    assert env({"data_parallel_size": 2})["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST" not in env({"max_num_seqs": 8})
    comm["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = "mnnvl"  # the user's choice
    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in env({"tensor_parallel_size": 2})
    assert "--compilation-config" in argv({"tensor_parallel_size": 2})  # the pass stays off


def test_fp8_options_follow_hardware_model_and_exact(cpu_ctx):
    from qtune.host.gpu import GPU, GPUReport

    def names(cc="9.0", exact=False, config=None):
        gpus = [GPU(0, "G", "GPU-0", 80 * 2**30, 80 * 2**30, cc, "0000:01:00.0", 0,
                    [], 5, 16, 5, 16)]
        host = dataclasses.replace(cpu_ctx.host, gpu=GPUReport(gpus, "580", "13.0", None))
        model = cpu_ctx.model if config is None else dataclasses.replace(
            cpu_ctx.model, config={**cpu_ctx.model.config, **config})
        ctx = dataclasses.replace(cpu_ctx, host=host, model=model, exact=exact,
                                  install=dataclasses.replace(cpu_ctx.install,
                                                              build="cuda"))
        return {p.name for p in VLLM().space(ctx)}

    assert {"kv_cache_dtype", "quantization"} <= names()
    # Ampere has no fp8 tensor cores; --exact keeps the model's numerics.
    assert not {"kv_cache_dtype", "quantization"} & names(cc="8.0")
    assert not {"kv_cache_dtype", "quantization"} & names(exact=True)
    # A checkpoint already quantized is not quantized again.
    assert "quantization" not in names(config={"quantization_config": {"bits": 4}})


def test_quantization_none_is_no_flag(cpu_ctx):
    ctx = _gpu_ctx(cpu_ctx)
    argv = list(VLLM().launch_spec({"quantization": "none"}, ctx, host="h", port=1).argv)
    assert "--quantization" not in argv
    argv = list(VLLM().launch_spec({"quantization": "fp8"}, ctx, host="h", port=1).argv)
    assert argv[argv.index("--quantization") + 1] == "fp8"


def test_chunked_prefill_off_only_where_it_can_run(cpu_ctx):
    # 40960-token context: "off" would need max_num_batched_tokens >= 40960.
    assert "enable_chunked_prefill" not in {p.name for p in VLLM().space(cpu_ctx)}
    short = dataclasses.replace(cpu_ctx, max_model_len=8192)
    assert "enable_chunked_prefill" in {p.name for p in VLLM().space(short)}


def test_pythonpath_install_is_carried(cpu_ctx):
    ctx = dataclasses.replace(cpu_ctx, install=dataclasses.replace(
        cpu_ctx.install, pythonpath="/tmp/site"))
    assert VLLM().launch_spec({}, ctx, host="h", port=1).env["PYTHONPATH"] == "/tmp/site"
    assert "PYTHONPATH" not in VLLM().launch_spec({}, cpu_ctx, host="h", port=1).env


def test_check_hard_constraints(cpu_ctx):
    v = VLLM()
    assert v.check({"max_num_seqs": 64, "max_num_batched_tokens": 32}, cpu_ctx)
    # chunked prefill off: one step must hold max_model_len (40960 here)
    assert v.check({"enable_chunked_prefill": False,
                    "max_num_batched_tokens": 8192}, cpu_ctx)
    assert not v.check({"enable_chunked_prefill": True, "max_num_seqs": 64,
                        "max_num_batched_tokens": 8192}, cpu_ctx)


def test_an_fp8_kv_cache_on_the_cpu_build_needs_avx512_or_amx(cpu_ctx):
    """vLLM 0.32's CPU attention refuses it at start without either (a CI
    host without AVX-512 lost a start to it): refused before a launch."""
    v = VLLM()
    fp8 = {"kv_cache_dtype": "fp8"}
    assert "avx512f" in cpu_ctx.host.cpu.flags and not v.check(fp8, cpu_ctx)
    for kept in ([], ["avx2"], ["avx2", "amx_tile"]):
        cpu = dataclasses.replace(cpu_ctx.host.cpu, flags=kept)
        ctx = dataclasses.replace(cpu_ctx, host=dataclasses.replace(cpu_ctx.host, cpu=cpu))
        problems = v.check(fp8, ctx)
        assert bool(problems) == ("amx_tile" not in kept), (kept, problems)
        assert not v.check({"kv_cache_dtype": "auto"}, ctx)


def test_launch_spec(cpu_ctx):
    spec = VLLM().launch_spec(
        {"max_num_seqs": 8, "enable_prefix_caching": False,
         "VLLM_CPU_KVCACHE_SPACE": 3}, cpu_ctx, host="127.0.0.1", port=23456)
    argv = list(spec.argv)
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "23456"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert "--no-enable-prefix-caching" in argv
    # config.json only: random weights and a generated tokenizer
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert "--tokenizer" in argv
    assert "--enforce-eager" in argv
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in " ".join(argv)
    assert spec.served_model == cpu_ctx.model.served_name


def test_to_flag():
    assert to_flag("enable_chunked_prefill", True) == ["--enable-chunked-prefill"]
    assert to_flag("enable_chunked_prefill", False) == ["--no-enable-chunked-prefill"]
    assert to_flag("max_num_seqs", 16) == ["--max-num-seqs", "16"]


def test_baseline_adjusts_kv_only_when_defaults_cannot_fit(cpu_ctx):
    params, note = VLLM().baseline(cpu_ctx)
    # The captured VM: node 0 has ~9.7 GiB of which 0.92 cannot be free.
    assert set(params) == {"VLLM_CPU_KVCACHE_SPACE"} and "0.92" in note


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ((FIX / "vllm-logs" / "cpu-memory-utilization.log").read_text(), "oom"),
        ((FIX / "vllm-logs" / "cpu-kv-space-too-large.log").read_text(), "oom"),
        ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
         "SchedulerConfig\n  Value error, max_num_batched_tokens (64) must be greater "
         "than or equal to max_num_seqs (128).", "invalid_config"),
        ("ValueError: Total number of attention heads (8) must be divisible by tensor "
         "parallel size (3).", "invalid_config"),
        ("ValueError: No available memory for the cache blocks.", "oom"),
        ("OSError: [Errno 98] Address already in use", "port_in_use"),
        ("api_server.py: error: unrecognized arguments: --bogus", "invalid_config"),
        ("RuntimeError: Cannot find any model weights with `/m`", "environment"),
        ("segfault somewhere\nKilled", "crash"),
    ],
)
def test_classify(text, reason):
    f = VLLM().classify(text)
    assert f.reason == reason
    assert f.detail


def test_a_gpu_worker_crash_at_start_is_fatal_and_named():
    # Captured on 2xH200 (TP 2): the worker died, the API server stayed up
    # and the search waited out the 600 s start timeout.
    import re

    from qtune.engines.vllm import _FATAL

    text = (FIX / "vllm-logs" / "h200x2-tp2-worker-crash.log").read_text()
    assert any(re.search(p, text) for p in _FATAL)
    f = VLLM().classify(text)
    assert (f.reason, f.detail) == (
        "crash", "torch.AcceleratorError: CUDA error: an illegal memory access was "
                 "encountered")


def test_a_hung_tp_start_logs_only_idle_lines_after_its_last_step():
    # Captured on 2xH200 (TP 2, trtllm all-reduce): after choosing the
    # backend the engine core only repeated its wait line for 145 s.  Those
    # lines are idle to the runner; nothing else in a start is.
    import re

    from qtune.engines.vllm import _FATAL, _IDLE

    lines = (FIX / "vllm-logs" / "h200x2-tp2-trtllm-hang.log").read_text().splitlines()
    last_step = max(i for i, ln in enumerate(lines) if "allreduce backend: trtllm" in ln)
    after = [ln for ln in lines[last_step + 1:] if "Parent process exited" not in ln]
    assert len(after) == 2 and all(any(re.search(p, ln) for p in _IDLE) for ln in after)
    assert not any(re.search(p, ln) for p in _IDLE for ln in lines[:last_step + 1])
    assert not any(re.search(p, "\n".join(lines)) for p in _FATAL)


def test_unmatched_log_names_its_last_error_not_a_stack_frame():
    f = VLLM().classify("RuntimeError: boom\nframe #21: __libc_start_main + 0x8b\n"
                        "frame #22: _start + 0x25\n")
    assert f == type(f)("crash", "RuntimeError: boom")


def test_every_engine_builds_a_spec_for_each_space_param(cpu_ctx):
    for engine in ENGINES.values():
        params = {}
        for p in engine.space(cpu_ctx):
            params[p.name] = {"int": int(p.low or 1), "float": p.low, "bool": True,
                              "choice": p.choices[0] if p.choices else None}[p.kind]
        spec = engine.launch_spec(params, cpu_ctx, host="127.0.0.1", port=1234)
        joined = " ".join(spec.argv) + " " + " ".join(spec.env)
        for name in params:
            assert name in spec.env or "--" + name.replace("_", "-") in joined


ARGS = __import__("json").loads((FIX / "vllm-0.32.0-cpu-engine-args.json").read_text())


def test_space_keeps_only_flags_the_installed_vllm_has(cpu_ctx):
    ctx = dataclasses.replace(cpu_ctx, engine_args=ARGS)
    assert {p.name for p in VLLM().space(ctx)} == {p.name for p in VLLM().space(cpu_ctx)}
    older = {k: v for k, v in ARGS.items() if k != "enable_prefix_caching"}
    ctx = dataclasses.replace(cpu_ctx, engine_args=older)
    assert "enable_prefix_caching" not in {p.name for p in VLLM().space(ctx)}


def test_space_file_can_tune_any_engine_flag(cpu_ctx):
    from qtune.search.config import SpaceOverride, apply_overrides

    ctx = dataclasses.replace(cpu_ctx, engine_args=ARGS)
    params, fixed = apply_overrides(VLLM().space(ctx), SpaceOverride(
        {"block_size": [64, 128], "scheduling_policy": "priority",
         "enforce_eager": True}, "s.yaml"), ARGS)
    by = {p.name: p for p in params}
    assert by["block_size"].choices == (64, 128)
    assert fixed == {"scheduling_policy": "priority", "enforce_eager": True}
    spec = VLLM().launch_spec({"block_size": 64, **fixed}, ctx, host="h", port=1)
    argv = list(spec.argv)
    assert argv[argv.index("--block-size") + 1] == "64"
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    with pytest.raises(InputError) as e:
        apply_overrides(VLLM().space(ctx), SpaceOverride({"blok_size": 8}, "s.yaml"), ARGS)
    assert "block_size" in e.value.hint
    with pytest.raises(InputError, match="low and high"):
        apply_overrides(VLLM().space(ctx), SpaceOverride({"block_size": {"low": 8}},
                                                         "s.yaml"), ARGS)
    with pytest.raises(InputError):
        apply_overrides(VLLM().space(ctx), SpaceOverride({"kv_cache_dtype": "fp9"},
                                                         "s.yaml"), ARGS)


def _gpu_ctx(cpu_ctx):
    from qtune.host.gpu import GPU, GPUReport

    gpus = [GPU(0, "NVIDIA H200", "GPU-0", 150 * 2**30, 150 * 2**30, "9.0",
                "0000:01:00.0", 0, [], 5, 16, 5, 16)]
    host = dataclasses.replace(cpu_ctx.host, gpu=GPUReport(gpus, "580", "13.0", None))
    return dataclasses.replace(cpu_ctx, host=host,
                               install=dataclasses.replace(cpu_ctx.install, build="cuda"))


def test_shape_from_the_defaults_run(cpu_ctx):
    """The H200 case: the defaults ran 353 requests at once with KV at 47%."""
    from qtune.engines.base import LoadView

    ctx = _gpu_ctx(cpu_ctx)
    space = VLLM().space(ctx)
    base = {"server": {"running_peak": 353, "kv_cache_usage_peak": 0.47,
                       "preemptions": 0}, "e2e_ms": {"p50": 8000}}
    load = LoadView(rate=40, concurrency=None, shared_prefix=False,
                    baseline=base)
    kept, fixed, notes = VLLM().shape(space, ctx, load)
    by = {p.name: p for p in kept}
    assert (by["max_num_seqs"].low, by["max_num_seqs"].high) == (89, 706)
    assert "gpu_memory_utilization" not in by and "enable_prefix_caching" not in by
    assert by["max_cudagraph_capture_size"].choices == (128, 256, 512)
    assert by["kv_cache_dtype"].choices == ("auto", "fp8")
    assert fixed == {} and len(notes) == 4
    # KV near full or preempting: memory stays tuned.
    full = {**base, "server": {**base["server"], "kv_cache_usage_peak": 0.9}}
    kept, _, _ = VLLM().shape(space, ctx, dataclasses.replace(load, baseline=full))
    assert "gpu_memory_utilization" in {p.name for p in kept}
    # Shared prefixes: prefix caching stays tuned.
    kept, _, _ = VLLM().shape(space, ctx, dataclasses.replace(load, shared_prefix=True))
    assert "enable_prefix_caching" in {p.name for p in kept}


def test_shape_without_metrics_and_at_fixed_concurrency(cpu_ctx):
    from qtune.engines.base import LoadView

    space = VLLM().space(cpu_ctx)
    # No /metrics: Little's law on the client's figures (12 req/s x 0.5 s = 6).
    load = LoadView(rate=12, concurrency=None, shared_prefix=True,
                    baseline={"e2e_ms": {"p50": 500}},
                    baseline_params={"VLLM_CPU_KVCACHE_SPACE": 4})
    kept, fixed, _ = VLLM().shape(space, cpu_ctx, load)
    seqs = next(p for p in kept if p.name == "max_num_seqs")
    assert (seqs.low, seqs.high) == (4, 256)  # 6/4 is below the static floor
    assert fixed == {}
    # The CPU KV budget is fixed at the baseline's when it never filled up.
    load = dataclasses.replace(load, baseline={"server": {"running_peak": 6,
                                                          "kv_cache_usage_peak": 0.1}})
    kept, fixed, _ = VLLM().shape(space, cpu_ctx, load)
    assert fixed == {"VLLM_CPU_KVCACHE_SPACE": 4}
    assert "VLLM_CPU_KVCACHE_SPACE" not in {p.name for p in kept}
    # A fixed-concurrency client never has more than 16 requests in flight.
    load = LoadView(rate=None, concurrency=16, shared_prefix=True)
    kept, _, notes = VLLM().shape(space, cpu_ctx, load)
    assert next(p for p in kept if p.name == "max_num_seqs").high == 16
    assert "16 in flight" in notes[0]
    # At 4 in flight (the static floor) there is nothing left to tune.
    load = dataclasses.replace(load, concurrency=4)
    kept, fixed, notes = VLLM().shape(space, cpu_ctx, load)
    assert fixed["max_num_seqs"] == 4 and "max_num_seqs" not in {p.name for p in kept}
    assert notes[0].startswith("max_num_seqs fixed at 4")


def test_cpu_kv_space_is_fixed_where_the_client_cannot_fill_it(cpu_ctx):
    """A client that keeps N requests in flight never needs more KV than N
    full contexts: a larger VLLM_CPU_KVCACHE_SPACE only costs its start (the
    quick start: engine init 34 s at 9 GiB, 15 s at 4 GiB)."""
    import math

    from qtune.engines.base import LoadView
    from qtune.estimate import GiB, kv_bytes_per_token

    cpu_ctx = dataclasses.replace(cpu_ctx, max_model_len=1024)
    space = VLLM().space(cpu_ctx)
    kv = next(p for p in space if p.name == "VLLM_CPU_KVCACHE_SPACE")
    need = (4 * cpu_ctx.effective_max_model_len
            * kv_bytes_per_token(cpu_ctx.model.config) / GiB)
    assert need <= 4 <= kv.high  # 4 contexts of 1,024 tokens: below the defaults' 4 GiB
    load = LoadView(rate=None, concurrency=4, shared_prefix=True,
                    baseline_params={"VLLM_CPU_KVCACHE_SPACE": 4})
    kept, fixed, notes = VLLM().shape(space, cpu_ctx, load)
    assert fixed["VLLM_CPU_KVCACHE_SPACE"] == 4
    assert "VLLM_CPU_KVCACHE_SPACE" not in {p.name for p in kept}
    assert any(n.startswith("VLLM_CPU_KVCACHE_SPACE fixed at 4 GiB, the defaults' run: "
                            "the client keeps at most 4 requests in flight") for n in notes)
    # Defaults without an explicit space: the least that holds every stream.
    kept, fixed, _ = VLLM().shape(space, cpu_ctx, dataclasses.replace(load, baseline_params={}))
    assert fixed["VLLM_CPU_KVCACHE_SPACE"] == max(int(kv.low), math.ceil(need))
    # Streams that no space in the range holds: the space stays tuned.
    many = math.ceil((kv.high + 1) / need * 4)
    kept, fixed, _ = VLLM().shape(space, cpu_ctx, dataclasses.replace(load, concurrency=many))
    assert "VLLM_CPU_KVCACHE_SPACE" in {p.name for p in kept}
    assert "VLLM_CPU_KVCACHE_SPACE" not in fixed


def test_gpu_batched_tokens_are_powers_of_two(cpu_ctx):
    from qtune.search.space import tidy

    space = VLLM().space(_gpu_ctx(cpu_ctx))
    mnbt = next(p for p in space if p.name == "max_num_batched_tokens")
    assert mnbt.pow2
    assert tidy({"max_num_batched_tokens": 5000}, space)["max_num_batched_tokens"] == 4096
    assert tidy({"max_num_batched_tokens": 40960}, space)["max_num_batched_tokens"] == 32768
    cpu = next(p for p in VLLM().space(cpu_ctx) if p.name == "max_num_batched_tokens")
    assert not cpu.pow2


def test_memory_asks_only_for_an_over_request():
    """vllm-cpu 0.32's refusal of a KV space above the free memory (captured
    from a start here) teaches that any larger ask fails too; a KV budget too
    small for one sequence does not (a larger one could start)."""
    v = VLLM()
    over = VLLM().classify(
        "(Worker pid=13105) ERROR 11-30 05:59:49 [multiproc_executor.py:1063] "
        "ValueError: Available memory on node 0 (22.02/23.54 GiB) on kv cache "
        "allocation is less than requested memory for kv (29.0 GiB). Decrease "
        "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used "
        "by other processes\n")
    assert over.reason == "oom"
    assert "VLLM_CPU_KVCACHE_SPACE" in v.memory_asks(over.detail)
    # vLLM's own check passed (22 of 22.1 GiB free) and the kernel killed
    # the worker while it allocated: a larger ask is killed too.
    killed = v.classify(
        "(EngineCore pid=17645) ERROR 11-30 06:30:45 [multiproc_executor.py:315] "
        "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down "
        "executor.\n(EngineCore pid=17645) ERROR 11-30 06:30:45 [core.py:1510] "
        "EngineCore failed to start.\nRuntimeError: Engine core initialization "
        "failed. See root cause above.\n")
    assert killed.reason == "oom" and v.memory_asks(killed.detail)
    small = v.classify("ValueError: To serve at least one request with the model's "
                       "max seq len (40960), (5.62 GiB KV cache is needed, ...\n")
    assert small.reason == "oom" and v.memory_asks(small.detail) == ()


def test_the_cpu_cache_memory_is_vllms():
    """VLLM_CPU_KVCACHE_SPACE in GiB; unset or 0 (vLLM's own default value),
    0.92 of the memory the server runs on; not a figure, the same."""
    v = VLLM()
    assert v.cpu_cache_memory({"VLLM_CPU_KVCACHE_SPACE": "40"}, 100.0) == (
        40.0, "40 GiB KV cache (VLLM_CPU_KVCACHE_SPACE)")
    for env in ({}, {"VLLM_CPU_KVCACHE_SPACE": "0"}, {"VLLM_CPU_KVCACHE_SPACE": "x"},
                {"VLLM_CPU_KVCACHE_SPACE": "inf"}):
        kv, why = v.cpu_cache_memory(env, 100.0)
        assert kv == pytest.approx(92.0) and "0.92" in why, env
    assert v.cpu_cache_memory({}, None)[0] == 4.0  # the memory not known: a guess
