"""``qtune check`` against a real vLLM (the CPU build): a server started with
the profile's flags is the tuned config, and one started with one flag
changed is caught, by name, from what the server itself reports.  As a user
runs it: the CLI, its exit codes, its JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qtune.bench import BenchConfig, measure
from qtune.engines import probe_host as probe
from qtune.engines.base import SpaceContext
from qtune.engines.vllm import VLLM
from qtune.load.workload import Workload
from qtune.model import resolve_model
from qtune.server import Server, free_port
from tests.fakes.profile import sample_profile

ROOT = Path(__file__).parent.parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not HAVE_VLLM and not os.environ.get("QTUNE_REQUIRE_VLLM"),
                                 reason="vLLM not installed")]

TUNED = {"VLLM_CPU_KVCACHE_SPACE": 1, "max_num_seqs": 8, "enable_prefix_caching": False}
WORKLOAD = Workload(input_len=64, output_len=16, concurrency=2, requests=24,
                    warmup_requests=4, seed=3)


def _check(profile_path: Path, url: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "qtune", "check", str(profile_path), "--url",
                        url, "--json"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_check_as_tuned_and_with_one_flag_changed(tmp_path):
    import vllm

    m = resolve_model(None)
    host = probe()
    ctx = SpaceContext(host, m, host.engines.get("vllm"))
    eng = VLLM()
    spec = eng.launch_spec(TUNED, ctx, host="127.0.0.1", port=free_port())
    with Server(spec, tmp_path / "tuned.log") as srv:
        srv.wait_ready(600)
        # The profile's figures: this server, measured as the search does.
        best = measure(spec.base_url, spec.served_model, WORKLOAD,
                       BenchConfig(urls=[spec.base_url], workload=WORKLOAD,
                                   tokenizer=m.tokenizer_dir))
        prof = sample_profile(
            engine={"name": "vllm", "version": vllm.__version__, "build": "cpu"},
            model={"id": spec.served_model, "path": str(m.path),
                   "served_name": spec.served_model},
            params={k: v for k, v in TUNED.items() if k != "VLLM_CPU_KVCACHE_SPACE"},
            env={"VLLM_CPU_KVCACHE_SPACE": "1"}, argv=list(spec.argv),
            workload=WORKLOAD.to_dict(),
            metrics={"objective": {"name": "e2e_p99", "direction": "minimize",
                                   "best": best["e2e_ms"]["p99"], "baseline": None},
                     "best": best})
        path = tmp_path / "tuned.yaml"
        path.write_text(yaml.safe_dump(prof.model_dump(mode="json")))
        rc, res = _check(path, spec.base_url)
        assert res["config"]["differ"] == [], res["config"]
        # what the server reported, checked against the profile
        assert {"engine version", "max_num_seqs", "enable_prefix_caching",
                "VLLM_CPU_KVCACHE_SPACE"} <= set(res["config"]["checked"])
        assert res["compare"]["metric"] == "e2e_p99" and res["compare"]["now"] > 0
        assert rc in (0, 4) and res["exit_code"] == rc  # speed on 2 shared cores: either

    changed = eng.launch_spec({**TUNED, "enable_prefix_caching": True}, ctx,
                              host="127.0.0.1", port=free_port())
    with Server(changed, tmp_path / "changed.log") as srv:
        srv.wait_ready(600)
        rc, res = _check(path, changed.base_url)
    assert rc == 5, res
    differ = {d["what"]: d for d in res["config"]["differ"]}
    assert set(differ) == {"enable_prefix_caching"}
    assert differ["enable_prefix_caching"]["running"] is True
    assert "runs" not in res  # a different config is not measured
