"""The memory estimate against known models' published sizes."""

from __future__ import annotations

import pytest

from qtune.estimate import GiB, estimate_cpu, estimate_gpu, kv_bytes_per_token, param_count

QWEN3_4B = {"num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
            "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "max_position_embeddings": 40960}


def test_qwen3_4b_parameter_count_and_kv():
    # Qwen3-4B: 4.0B parameters (model card: "Number of Parameters: 4.0B").
    assert param_count(QWEN3_4B) == pytest.approx(4.02e9, rel=0.03)
    # 2 x 36 layers x 8 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(QWEN3_4B) == 147456
    assert kv_bytes_per_token(QWEN3_4B, "fp8") == 73728


def test_gpu_fit():
    h200 = 150754820096
    e = estimate_gpu(QWEN3_4B, gpu_memory=h200, utilization=0.9, tp=1, max_model_len=40960)
    assert e.fits and 7 * GiB < e.weights < 8 * GiB
    assert e.max_tokens > 500_000
    small = estimate_gpu(QWEN3_4B, gpu_memory=16 * GiB, utilization=0.7, tp=1,
                         max_model_len=40960)
    assert not small.fits and "KV budget" in small.reason
    tiny = estimate_gpu(QWEN3_4B, gpu_memory=8 * GiB, utilization=0.9, tp=1,
                        max_model_len=1024)
    assert not tiny.fits and "weights" in tiny.reason
    assert estimate_gpu(QWEN3_4B, gpu_memory=8 * GiB, utilization=0.9, tp=2,
                        max_model_len=1024).fits
    # Two pipeline stages split the layers as two TP ranks split the heads.
    pp2 = estimate_gpu(QWEN3_4B, gpu_memory=8 * GiB, utilization=0.9, tp=1, pp=2,
                       max_model_len=1024)
    assert pp2.fits and pp2.weights == pytest.approx(tiny.weights / 2)
    # fp8 weights: the linear layers at one byte, the embedding stays bf16
    # (Qwen3-4B: 3.6B linear + 0.39B tied embedding parameters).
    q = estimate_gpu(QWEN3_4B, gpu_memory=h200, utilization=0.9, tp=1,
                     max_model_len=40960, quantization="fp8")
    assert 4.0 * GiB < q.weights < 4.5 * GiB
    assert q.max_tokens > e.max_tokens
    assert estimate_gpu(QWEN3_4B, gpu_memory=8 * GiB, utilization=0.9, tp=1,
                        max_model_len=1024, quantization="fp8").fits


def test_cpu_fit():
    e = estimate_cpu(QWEN3_4B, kv_space=4 * GiB, available=20 * GiB, max_model_len=4096)
    assert e.fits
    assert not estimate_cpu(QWEN3_4B, kv_space=100000 * GiB, available=20 * GiB,
                            max_model_len=4096).fits
    assert not estimate_cpu(QWEN3_4B, kv_space=0.1 * GiB, available=20 * GiB,
                            max_model_len=40960).fits


def test_adapter_estimate_on_this_cpu_host(cpu_ctx):
    from qtune.engines.vllm import VLLM

    assert VLLM().estimate({"VLLM_CPU_KVCACHE_SPACE": 1}, cpu_ctx).fits is False  # 40k ctx
    assert VLLM().estimate({"VLLM_CPU_KVCACHE_SPACE": 8}, cpu_ctx).fits
    assert not VLLM().estimate({"VLLM_CPU_KVCACHE_SPACE": 100000}, cpu_ctx).fits
