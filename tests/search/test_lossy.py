"""Lossy dimensions only where quality is measured (issue 27, item 6): fp8
weights and KV cache are searched where the quality gate can judge them, or
with --lossy; a winner whose numerics changed unmeasured says so in every
emitted file."""

from __future__ import annotations

import dataclasses

import pytest

from qtune.emit import emit
from qtune.engines.sglang import SGLang
from qtune.engines.tgi import TGI
from qtune.engines.vllm import VLLM
from qtune.errors import InputError
from qtune.options import QualityGate
from qtune.search.config import TuneConfig, check_config
from qtune.search.inputs import lossless
from tests.fakes.profile import sample_profile


def test_random_weights_keep_the_numerics_unless_asked(cpu_ctx):
    dummy = cpu_ctx.model
    assert dummy.load_format == "dummy"
    exact, why = lossless(TuneConfig(), VLLM(), dummy)
    assert exact and "random weights" in why and "--lossy" in why
    assert lossless(TuneConfig(quality=QualityGate(lossy=True)), VLLM(), dummy) == (False, None)
    assert lossless(TuneConfig(quality=QualityGate(exact=True)), VLLM(), dummy) == (True, None)


def test_real_weights_with_a_quality_gate_search_lossy_options(cpu_ctx):
    real = dataclasses.replace(cpu_ctx.model, has_weights=True)
    assert lossless(TuneConfig(), VLLM(), real) == (False, None)
    assert lossless(TuneConfig(), SGLang(), real)[0] is (
        SGLang().logprobs_request("m", "") is None)
    # an engine that answers no log-probabilities cannot be judged
    if TGI().logprobs_request("m", "") is None:
        exact, why = lossless(TuneConfig(), TGI(), real)
        assert exact and "log-probabilities" in why


def test_exact_and_lossy_together_are_refused():
    with pytest.raises(InputError, match="choose one"):
        check_config(TuneConfig(quality=QualityGate(exact=True, lossy=True)))


def test_an_unmeasured_lossy_winner_is_said_in_every_format():
    prof = sample_profile(metrics={
        "objective": {"name": "capacity", "direction": "maximize", "best": 28.0,
                      "baseline": 22.0},
        "startup_s": 40.0,
        "quality": {"measured": False, "note": "random weights (--load-format dummy)",
                    "numerics": {"quantization": "fp8"}}})
    for fmt in ("systemd", "compose", "kubernetes", "prometheus-rules", "host"):
        text = emit(prof, fmt)
        assert "quantization=fp8" in text and "NOT measured" in text, fmt
    plain = sample_profile()
    assert "NOT measured" not in emit(plain, "systemd")
