"""Provenance: emit and check say when this host is not the kind the profile
was tuned on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from qtune.host.provenance import engine_difference, host_differences

ROOT = Path(__file__).parent.parent.parent
H200 = {"gpus": ["NVIDIA H200 (143771 MiB)"], "driver": "580.159.04", "numa_nodes": 1,
        "cpu_model": "Intel(R) Xeon(R) Processor", "physical_cores": 16}


def test_each_differing_fact_is_one_line():
    here = {**H200, "gpus": ["NVIDIA H200 (143771 MiB)"] * 2, "driver": "575.57.08"}
    lines = host_differences(H200, here)
    assert lines == ["GPUs: tuned on 1 x NVIDIA H200 (143771 MiB), this host has "
                     "2 x NVIDIA H200 (143771 MiB)",
                     "GPU driver: tuned on 580.159.04, this host has 575.57.08"]
    assert host_differences(H200, dict(H200)) == []
    assert host_differences({"gpus": []}, {"numa_nodes": 2}) == []  # not recorded: not compared


def test_engine_version_compared_without_local_build_tags():
    assert engine_difference("0.26.0", "0.26.0+cu130", "vllm") is None
    assert "tuned on 0.26.0, this host has 0.32.0" in engine_difference("0.26.0", "0.32.0",
                                                                        "vllm")
    assert "not installed" in engine_difference("0.26.0", None, "vllm")


def test_emit_warns_for_a_profile_from_a_gpu_host():
    r = subprocess.run([sys.executable, "-m", "qtune", "emit",
                        "examples/h200-qwen3-4b/h200-qwen3-4b.yaml", "--format", "systemd",
                        "--user", "root", "--allow-tmp", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    gpu_here = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0 \
        if Path("/usr/bin/nvidia-smi").exists() else False
    if not gpu_here:
        assert any(w.startswith("GPUs: tuned on 1 x NVIDIA H200") for w in warnings)
        assert "this host differs from the one the profile was tuned on" in r.stderr
