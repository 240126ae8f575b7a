"""Where a start went (issue 27, item 4): the vLLM adapter reads the phases
from real start logs, the compile cache's hit or miss among them, and the
runner puts the compile caches in a folder of qtune's."""

from __future__ import annotations

from pathlib import Path

from qtune.engines import compile_cache_root, on_this_host, trial_spec
from qtune.engines.vllm import VLLM
from qtune.host.installed import EngineInstall
from qtune.launch import StartPhases

LOGS = Path(__file__).parent.parent / "fixtures" / "vllm-logs"


def test_h200_warm_start_phases():
    """Run 11 on one H200: torch.compile loaded from the cache (8.6 s),
    graphs 9 s, engine init 31.8 s."""
    ph = VLLM().start_phases((LOGS / "h200-0.26.0-start-warm-cache.log").read_text(), 64.0)
    assert ph.cache_hit is True and ph.compile_s == 8.58 and ph.graphs_s == 9.0
    assert ph.init_s == 31.84 and abs(ph.other_s - (64.0 - 31.84)) < 1e-9
    assert "compile 9 s (cache hit)" in ph.text() and ph.text().startswith("start 64 s:")


def test_cpu_eager_start_phases():
    """vLLM 0.32 on the CPU runs eager: weights and engine init, nothing
    compiled, no cache to hit."""
    ph = VLLM().start_phases((LOGS / "cpu-0.32.0-start-smollm2.log").read_text(), 49.0)
    assert ph.weights_s == 0.91 and ph.init_s == 12.86
    assert ph.compile_s is None and ph.graphs_s is None and ph.cache_hit is None
    assert "compile" not in ph.text()


def test_a_compile_that_missed_the_cache_is_a_miss():
    log = ("(EngineCore pid=1) INFO [backends.py:399] Compiling a graph for compile range "
           "(1, 8192) takes 41.20 s\n(EngineCore pid=1) INFO [monitor.py:20] torch.compile "
           "took 48.79 s in total\n")
    ph = VLLM().start_phases(log, 120.0)
    assert ph.cache_hit is False and ph.compile_s == 48.79


def test_data_parallel_replicas_count_their_slowest():
    log = ("init engine (profile, create kv cache, warmup model) took 67.30 s\n"
           "init engine (profile, create kv cache, warmup model) took 67.56 s\n")
    assert VLLM().start_phases(log, 100.0).init_s == 67.56


def test_an_unknown_log_leaves_the_whole_start_unaccounted():
    ph = VLLM().start_phases("nothing useful", 30.0)
    assert ph == StartPhases(ready_s=30.0) and ph.other_s == 30.0


def test_compile_caches_live_in_qtunes_folder_on_this_host(cpu_ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path))
    gpu = EngineInstall("vllm", "0.26.0+cu130", "cuda", "/opt/venv/bin/python")
    root = compile_cache_root(gpu)
    assert root == tmp_path / "compile" / "vllm-0.26.0+cu130-cuda"
    spec = trial_spec(VLLM(), {}, cpu_ctx, 1234)
    env = spec.host_env
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "compile"))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "compile"))
    # host-only: never in the environment a profile or unit carries
    assert "VLLM_CACHE_ROOT" not in spec.env
    assert on_this_host(VLLM(), spec, cpu_ctx.install).host_env == env


def test_capture_size_is_pinned_only_when_not_searched(cpu_ctx):
    import dataclasses

    from qtune.engines.base import Param

    eng = VLLM()
    gpu_ctx = dataclasses.replace(cpu_ctx, install=dataclasses.replace(
        cpu_ctx.install, build="cuda"))
    seqs = [Param("max_num_seqs", "int", low=4, high=512)]
    assert eng.pinned_for_cache(seqs, {}, gpu_ctx) == {"max_cudagraph_capture_size": 512}
    capture = Param("max_cudagraph_capture_size", "choice", choices=(64, 512))
    assert eng.pinned_for_cache([*seqs, capture], {}, gpu_ctx) == {}
    assert eng.pinned_for_cache(seqs, {"max_cudagraph_capture_size": 64}, gpu_ctx) == {}
    assert eng.pinned_for_cache(seqs, {}, cpu_ctx) == {}  # eager: nothing captured
