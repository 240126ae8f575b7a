"""The short version of benchmarks/fidelity_vs_vllm_bench.py: qtune's client
and vLLM's own request function send the same prompts on the same Poisson
schedule to one real vLLM server, and the medians must agree.

Tolerances are wider than the benchmark's 5% target: 2 × 40 requests on a
2-core machine that CI shares cannot resolve 5%; this catches definition
errors (a wrong TTFT or ITL, a bad schedule), which show as 2× gaps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_e2e_vllm import HAVE_VLLM

ROOT = Path(__file__).parent.parent
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed")]


def test_qtune_agrees_with_vllms_client(tmp_path):
    out = tmp_path / "fid.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fidelity_vs_vllm_bench.py"),
                        "--quick", "--repeats", "2", "--vllm-client", "reqfunc",
                        "--quiet", "2", "--max-tries", "1", "--fit-rate", "--json", str(out),
                        "--workdir", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    pooled = json.loads(out.read_text())["pooled"]
    q, v = pooled["qtune"], pooled["vllm"]
    # The bound catches definition and unit errors (ms against s, TPOT with
    # TTFT in it), not 10% gaps: the server alone moves TPOT p50 by up to
    # 1.44x between runs of the *same* client on this 2-core VM (4.61 against
    # 3.20 ms, fidelity_vs_vllm_bench.py, issue 3 note), and one CI run saw 0.73.
    # --fit-rate keeps the server ahead of the load: a CI host without
    # AVX-512 was overloaded at 4 req/s (TPOT p50 113 against 213 ms).
    for m in ("ttft_p50", "tpot_p50", "itl_p50", "e2e_p50"):
        assert 0.6 < q[m] / v[m] < 1.67, (m, q[m], v[m])
    # Same schedule, same count: the offered and served rates must match.
    assert q["req_per_s"] / v["req_per_s"] == pytest.approx(1.0, abs=0.05)
