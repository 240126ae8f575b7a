"""qtune bench against one real vLLM server (CPU build): every workload
shape and arrival mode, the server-side view, and capacity under an SLO
whose answer is re-measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_e2e_vllm import HAVE_VLLM

ROOT = Path(__file__).parent.parent
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed")]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    from qtune.engines import probe_host as probe
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    model = resolve_model(None)
    host = probe()
    ctx = SpaceContext(host, model, host.engines.get("vllm"))
    spec = VLLM().launch_spec({"VLLM_CPU_KVCACHE_SPACE": 2, "max_num_seqs": 32},
                              ctx, host="127.0.0.1", port=free_port())
    log = tmp_path_factory.mktemp("bench") / "server.log"
    with Server(spec, log) as s:
        s.wait_ready(600, classify=VLLM().classify)
        yield spec.base_url, model.tokenizer_dir


def bench(url: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "qtune", "bench", "--url", url, "--json",
                        *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "4", "--input-len", "128", "--output-len", "16"],
        ["--rate", "8", "--input-len", "64-256", "--output-len", "8-24"],
        ["--rate", "8", "--burstiness", "0.5", "--input-len", "normal:128:32"],
        ["--rate", "8", "--arrival", "constant", "--endpoint", "completions"],
        ["--concurrency", "4", "--prefix-count", "2", "--prefix-len", "256",
         "--input-len", "32"],
    ],
    ids=["concurrency", "uniform-poisson", "bursty-normal", "constant", "shared-prefix"],
)
def test_workloads_and_arrivals(vllm_url, args):
    url, tok = vllm_url
    d = bench(url, "--requests", "24", "--warmup", "2", "--output-len", "16",
              "--tokenizer", str(tok), *args)
    assert d["completed"] == 24 and d["failed"] == 0 and d["truncated"] == 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert d[key]["p99"] >= d[key]["p50"] > 0
    assert d["tokenizer"] == str(tok)
    # Exact prompt lengths: the server counted what the client meant to send.
    assert d["input_tokens"] > 0
    sv = d["server"]
    assert sv["generation_tokens"] >= 24 * 8
    if "--prefix-count" in args:
        assert sv["prefix_cache_hit_rate"] > 0.3


def test_dataset_and_chat(vllm_url, tmp_path):
    url, _ = vllm_url
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": " ".join(f"t{10 + i + j}" for j in range(40)),
                                       "output_tokens": 12}) for i in range(8)))
    d = bench(url, "--dataset", str(f), "--requests", "12", "--concurrency", "3",
              "--warmup", "0")
    assert d["completed"] == 12 and d["output_tokens"] == 12 * 12


def test_find_capacity_remeasured(vllm_url):
    """The SLO leaves room at low loads: with 400 ms the first search on a
    fresh server failed 4 and 2 req/s (TTFT p99 414 ms; one slow request of
    40 decides a p99) and held 1.8, a later one 4.25, and twice in CI (the
    last at 06df18b, TTFT p99 <= 1000 ms) every re-measure failed and nothing
    was found (2 cores, client and server).  The test is of the procedure,
    not of one request's luck: the SLO is on the median, which one slow
    request cannot decide."""
    url, _ = vllm_url
    d = bench(url, "--find-capacity", "--slo", "ttft_p50<=500ms", "--rate", "4",
              "--capacity-tolerance", "0.25",
              "--requests", "40", "--warmup", "4", "--input-len", "128", "--capacity-window", "5",
              "--output-len", "16")
    cap = d["capacity"]
    assert cap["found"], cap
    assert cap["at_value"]["ok"] and cap["at_value"]["load"] == cap["value"]
    assert cap["at_value"]["ttft_p50"] <= 500


def test_model_folder_without_tokenizer_flag_sends_exact_lengths(tmp_path):
    """`qtune bench --model <folder> --input-len 200` with no --tokenizer sent
    678 prompt tokens a request on the CPU target.  Here vLLM serves the model
    under its folder's path (as `vllm serve /path` does); qtune must find the
    served model's tokenizer (the folder's own, else the server's /tokenize)
    and the server must count 200 tokens a request."""
    import dataclasses

    from qtune.engines import probe_host as probe
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    model = resolve_model(None)
    host = probe()
    ctx = SpaceContext(host, model, host.engines.get("vllm"))
    spec = VLLM().launch_spec({"VLLM_CPU_KVCACHE_SPACE": 2, "max_num_seqs": 16},
                              ctx, host="127.0.0.1", port=free_port())
    i = spec.argv.index("--served-model-name")
    argv = spec.argv[:i] + spec.argv[i + 2:]  # served as its path
    spec = dataclasses.replace(spec, argv=argv, served_model=str(model.path))
    with Server(spec, tmp_path / "server.log") as s:
        s.wait_ready(600, classify=VLLM().classify)
        d = bench(spec.base_url, "--model", str(model.path), "--input-len", "200",
                  "--output-len", "8", "--requests", "16", "--concurrency", "4",
                  "--warmup", "2", "--no-server-metrics")
    assert d["completed"] == 16 and d["failed"] == 0
    assert d["tokenizer"] is not None and "tokenizer_warning" not in d
    n = d["completed"]
    # The server's own usage: 200 tokens a request (one more at most: a BOS).
    assert 200 * n <= d["input_tokens"] <= 201 * n, d["prompt_length"]
    assert d["prompt_length"]["requests"] == n
    assert 200 <= d["prompt_length"]["server_mean"] <= 201
    assert "length_mismatch" not in d
