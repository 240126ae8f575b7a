"""The quality gate: its arithmetic, the infeasibility decision, vLLM's
prompt-logprobs answer read as untrusted text, the shipped texts, and a
study with the stand-in engine in which a lossy config is refused."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.engines.vllm import VLLM
from qtune.options import DEFAULT_MAX_LOSS, Confirmation, QualityGate
from qtune.quality import (
    Quality,
    Sample,
    compare,
    eval_set,
    not_measured,
    perplexity,
    violation,
)

# Not in the fast tier: quality gates on started fake servers (2-3 s each).
pytestmark = pytest.mark.slow



def test_perplexity_is_exp_of_the_mean_negative_logprob_over_all_tokens():
    # Pooled over tokens, not averaged per passage: 3 tokens at -1, -1, -4.
    assert perplexity([[-1.0, -1.0], [-4.0]]) == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError):
        perplexity([[], []])


def test_compare_gives_the_relative_rise_the_token_agreement_and_exact_matches():
    ref = Sample([[-1.0, -2.0], [-3.0]], ["a", "b", "c", "d"])
    cand = Sample([[-1.1, -2.1], [-3.1]], ["a", "b", "x", "d"], seconds=2.5)
    q = compare(ref, cand, {"kv_cache_dtype": "fp8"})
    assert q.measured and q.note is None
    # Every token 0.1 nats less likely: perplexity x e^0.1, +10.5%.
    assert q.loss == pytest.approx(math.exp(0.1) - 1)
    assert q.perplexity == pytest.approx(math.exp(2.1))
    assert q.reference_perplexity == pytest.approx(math.exp(2.0))
    assert q.logprob_diff == pytest.approx(0.1)
    assert (q.exact_match, q.prompts, q.tokens) == (3, 4, 3)
    assert q.numerics == {"kv_cache_dtype": "fp8"}
    assert q.text() == ("perplexity +10.52% (8.166 vs 7.389), greedy 3/4 identical")
    # A better perplexity is a negative loss: never a violation.
    assert compare(cand, ref).loss == pytest.approx(math.exp(-0.1) - 1)


def test_compare_leaves_out_the_token_agreement_when_the_tokens_differ():
    q = compare(Sample([[-1.0, -1.0]], []), Sample([[-1.0, -1.0, -1.0]], []))
    assert q.logprob_diff is None and q.loss == pytest.approx(0.0)


def test_the_reference_compares_with_itself():
    s = Sample([[-0.5]], ["x"])
    q = compare(s, s, reference=True)
    assert q.loss == 0 and q.note == "reference"
    assert q.text() == "reference: perplexity 1.649"


def test_violation_decides_feasibility():
    over = compare(Sample([[-1.0]], []), Sample([[-1.05]], []))  # +5.1%
    under = compare(Sample([[-1.0]], []), Sample([[-1.005]], []))  # +0.5%
    assert violation(over, 0.01) > 0 and violation(over, 0.06) <= 0
    assert violation(under, DEFAULT_MAX_LOSS) <= 0
    assert violation(under, 0.0) > 0  # 0: no loss at all
    assert violation(None, 0.01) == 0
    # Random weights: nothing to gate, lossy or not.
    assert violation(not_measured("random weights (--load-format dummy)",
                                  {"kv_cache_dtype": "fp8"}), 0.01) == 0
    # Real weights, a lossy config, and no figure: not let through.
    assert violation(not_measured("the server's answers could not be read",
                                  {"kv_cache_dtype": "fp8"}), 0.01) > 0
    # Real weights, nothing lossy, no figure: no reason to refuse.
    assert violation(not_measured("the server's answers could not be read"), 0.01) == 0


def test_quality_and_sample_round_trip_and_refuse_what_they_are_not():
    q = compare(Sample([[-1.0, -2.0]], ["a"]), Sample([[-1.0, -2.5]], ["b"]), {"x": 1})
    assert Quality.from_dict(json.loads(json.dumps(q.to_dict()))) == q
    assert Quality.from_dict(not_measured("why").to_dict()) == not_measured("why")
    for bad in (None, [], {"measured": "yes"}, {"measured": True, "loss": [1], "x": 1,
                                                "numerics": 3, "prompts": {}}):
        got = Quality.from_dict(bad)
        assert got is None or isinstance(got, Quality)
    assert Quality.from_dict({"measured": 1}) is None
    s = Sample([[-1.23456789]], ["a"], 1.0)
    assert Sample.from_dict(s.to_dict()) == Sample([[-1.2346]], ["a"], 1.0)
    for bad in (None, {}, {"logprobs": 3, "greedy": []}, {"logprobs": [["x"]], "greedy": []}):
        assert Sample.from_dict(bad) is None


def test_the_shipped_texts_are_real_english_with_their_source_and_licence():
    es = eval_set()
    assert "pydoc_data/topics.py" in es.source and "PSF" in es.licence
    chars = sum(len(p) for p in es.passages)
    # About 3,000 tokens (~4.3 characters a token of English).
    assert 10_000 < chars < 20_000
    assert all(len(p) <= 1800 for p in es.passages)  # fits any served context
    assert len(es.greedy_prompts) == 16 and len(set(es.greedy_prompts)) == 16
    words = " ".join(es.passages).split()
    assert sum(w.isalpha() for w in words) / len(words) > 0.7


def test_the_builtin_prompt_set_is_a_workload():
    from qtune.load.datasets import dataset_file
    from qtune.load.prompts import RequestSource
    from qtune.load.workload import Workload

    wl = Workload(dataset="builtin:python-docs", requests=4)
    src = RequestSource(wl, None, seed=0)
    reqs = src.take(64)
    assert len({r.prompt for r in reqs}) == 64
    assert all(r.max_tokens == 64 and len(r.prompt.split()) > 30 for r in reqs)
    assert dataset_file("builtin:python-docs").is_file()
    assert str(dataset_file("other.jsonl")) == "other.jsonl"


def test_vllm_reads_its_prompt_logprobs_answer():
    v = VLLM()
    path, body = v.logprobs_request("m", "some text")
    assert path == "/v1/completions" and body["prompt_logprobs"] == 0
    answer = {"choices": [{"text": "x", "prompt_logprobs": [
        None, {"11": {"logprob": -1.5, "rank": 3, "decoded_token": " a"}},
        {"7": {"logprob": -0.25, "rank": 1, "decoded_token": "b"}}]}]}
    assert v.read_logprobs(answer) == [-1.5, -0.25]
    # Two entries at one position (top-k asked): which one is the text's?
    two = {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": -1.0},
                                                   "2": {"logprob": -2.0}}]}]}
    for bad in (two, {"choices": []}, {"choices": [{"prompt_logprobs": None}]},
                {"choices": [{"prompt_logprobs": [None]}]},
                {"choices": [{"prompt_logprobs": [None, {"1": {"logprob": 0.5}}]}]},
                {"choices": [{"prompt_logprobs": [None, None]}]}):
        with pytest.raises(ValueError):
            v.read_logprobs(bad)
    assert v.read_text({"choices": [{"text": " Paris."}]}) == " Paris."
    with pytest.raises(ValueError):
        v.read_text({"choices": [{"text": 3}]})


def test_vllm_names_the_params_that_change_numerics():
    v = VLLM()
    assert v.changes_numerics({"kv_cache_dtype": "auto", "quantization": "none",
                               "max_num_seqs": 8}) == {}
    assert v.changes_numerics({"kv_cache_dtype": "fp8", "quantization": "fp8",
                               "dtype": "float32", "enable_prefix_caching": True}) == {
        "kv_cache_dtype": "fp8", "quantization": "fp8", "dtype": "float32"}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3),
                                                                inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json, st.fixed_dictionaries({"choices": st.lists(
    st.fixed_dictionaries({"prompt_logprobs": _json, "text": _json}), max_size=2)})))
def test_any_answer_is_read_or_refused_with_a_value_error(answer):
    v = VLLM()
    try:
        lps = v.read_logprobs(answer)
    except ValueError:
        pass
    else:
        assert lps and all(isinstance(x, float) and -1e4 < x <= 0 for x in lps)
    try:
        text = v.read_text(answer)
    except ValueError:
        pass
    else:
        assert isinstance(text, str)


# The search with the stand-in engine: a "lossy" flag makes its server score
# every token 0.05 nats lower (perplexity +5.1%) and answer other greedy text.


@pytest.fixture
def lossy_study(monkeypatch, cpu_host, tmp_path):
    import qtune.search.inputs as search
    from qtune.engines import ENGINES
    from qtune.engines.base import LaunchSpec, Param, SpaceContext
    from qtune.host.installed import EngineInstall, InstalledEngines
    from qtune.load.workload import Workload
    from qtune.search.config import TuneConfig
    from tests.fakes.engine import FakeEngine
    from tests.fakes.model import make_model

    class LossyEngine(FakeEngine):
        def space(self, ctx: SpaceContext) -> list[Param]:
            return [Param("lossy", "bool")]

        def launch_spec(self, params: Mapping[str, Any], ctx: SpaceContext, *,
                        host: str, port: int) -> LaunchSpec:
            spec = super().launch_spec(params, ctx, host=host, port=port)
            shift = ["--logprob-shift", "0.05"] if params.get("lossy") else []
            return dataclasses.replace(spec, argv=(*spec.argv, *shift))

        def changes_numerics(self, params: Mapping[str, Any]) -> dict[str, Any]:
            return {"lossy": True} if params.get("lossy") else {}

        # The stand-in server answers in vLLM's shape.
        logprobs_request = VLLM.logprobs_request  # type: ignore[assignment]
        read_logprobs = VLLM.read_logprobs  # type: ignore[assignment]

    monkeypatch.setitem(ENGINES, "fake", LossyEngine())
    host = dataclasses.replace(cpu_host, engines=InstalledEngines(
        sys.executable, [EngineInstall("fake", "1.0", "cpu", sys.executable)]))
    monkeypatch.setattr(search, "probe", lambda **kw: host)
    model = make_model(tmp_path / "model", num_hidden_layers=2, hidden_size=64,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=512, max_position_embeddings=4096)
    (model / "model.safetensors").write_bytes(b"")  # real weights, as far as qtune sees
    return TuneConfig(
        model=str(model), engine="fake", trials=3, seed=1, sampler="random",
        workload=Workload(input_len=8, output_len=4, concurrency=2, requests=6,
                          warmup_requests=1),
        studies_dir=tmp_path / "studies", profiles_dir=tmp_path / "profiles",
        study="q", confirm=Confirmation(top=0), startup_timeout=60)


def test_a_study_refuses_a_config_whose_quality_drops_beyond_the_threshold(
        lossy_study, monkeypatch):
    from qtune.profile import Profile
    from qtune.report import render_html
    from qtune.search import tune
    from qtune.search.result import trials_frame
    from tests.fakes.sampler import script_random_sampler

    script_random_sampler(monkeypatch, [{"lossy": True}, {"lossy": False}])
    res = tune(lossy_study)
    base, lossy, clean = res.trials
    assert base.baseline and base.quality["note"] == "reference"
    assert base.feasible and clean.feasible
    assert clean.quality["loss"] == pytest.approx(0.0)
    assert clean.quality["exact_match"] == 16
    # +5.1% against the default 1%: measured, then refused like an SLO breach.
    assert lossy.status == "ok" and not lossy.feasible
    assert lossy.quality["loss"] == pytest.approx(math.exp(0.05) - 1)
    assert lossy.quality["exact_match"] == 0 and lossy.quality["numerics"] == {"lossy": True}
    assert lossy.reason == "quality_loss"
    assert "over --max-quality-loss 1%" in lossy.detail
    assert res.best is not None and res.best.number != lossy.number
    prof = Profile.load(res.profile_path)
    q = prof.metrics["quality"]
    assert q["measured"] and q["max_loss"] == DEFAULT_MAX_LOSS and "perplexity" in q["text"]
    import optuna

    from qtune.search import open_storage

    study = optuna.load_study(study_name="q", storage=open_storage(res.storage))
    df = trials_frame(study)
    assert df.loc[df.trial == lossy.number, "quality_loss"].item() == pytest.approx(
        math.exp(0.05) - 1)
    page = render_html(study, res.storage, df, {})
    assert "Answer quality" in page and "refused: over the threshold" in page
    import io

    import qtune.console as console
    from qtune.report import report

    buf = io.StringIO()
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=200))
    console.render_report(report("q", res.storage))
    rows = {line.split()[0]: line for line in buf.getvalue().splitlines()
            if line.strip()[:1].isdigit()}
    assert "+5.13%" in rows[str(lossy.number)] and "quality_loss: quality:" in rows[
        str(lossy.number)]
    assert "+0.00%" in rows[str(clean.number)]


def test_a_larger_threshold_lets_the_lossy_config_through(lossy_study, monkeypatch):
    from qtune.search import tune
    from tests.fakes.sampler import script_random_sampler

    script_random_sampler(monkeypatch, [{"lossy": True}, {"lossy": False}])
    res = tune(dataclasses.replace(lossy_study, trials=2,
                                   quality=QualityGate(max_loss=0.06)))
    lossy = res.trials[1]
    assert lossy.feasible and lossy.reason is None


def test_random_weights_say_not_measured(lossy_study, monkeypatch, tmp_path):
    from qtune.search import tune
    from tests.fakes.sampler import script_random_sampler

    (tmp_path / "model" / "model.safetensors").unlink()
    script_random_sampler(monkeypatch, [{"lossy": True}])
    res = tune(dataclasses.replace(lossy_study, trials=2))
    for t in res.trials:
        assert t.feasible and t.quality["measured"] is False
        assert t.quality["note"] == "random weights (--load-format dummy)"
    prof = res.profile
    assert prof is not None
    assert any("not measured: random weights" in n for n in prof.notes)
