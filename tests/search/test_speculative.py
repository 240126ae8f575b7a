"""The speculative-decoding phase: the acceptance arithmetic, the keep-or-not
decision, the vLLM adapter's candidates from the installed config classes,
and the phase in a study with the stand-in engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from qtune.engines import ENGINES
from qtune.engines.base import SpaceContext
from qtune.engines.vllm import VLLM, to_flag
from qtune.load.prometheus import MetricsWatcher, parse
from qtune.metrics import spec_acceptance
from qtune.model import resolve_model
from qtune.options import Confirmation
from qtune.profile import Profile
from qtune.search import tune
from qtune.search.result import summary_line
from qtune.search.speculative import decide
from tests.fakes.engine import FakeEngine
from tests.search.test_study_fake_engine import fake  # noqa: F401  (fixture)

# Not in the fast tier: speculative phases on the fake engine (12-18 s each).
pytestmark = pytest.mark.slow


# What the installed vLLM 0.32 CPU build's SpeculativeConfig gives through
# vllm_args (its method Literal, flattened; an excerpt of its fields).
_V032 = {"flag": "--speculative-config", "kind": "str", "default": None,
         "methods": ["deepseek_mtp", "draft_model", "eagle", "eagle3", "medusa", "mtp",
                     "ngram", "ngram_gpu", "suffix"],
         "fields": ["num_speculative_tokens", "model", "method", "prompt_lookup_max",
                    "prompt_lookup_min"],
         "suffix_installed": False}


def test_acceptance_follows_vllms_definitions():
    # 10 drafts of 3 tokens, 12 accepted: 40% of draft tokens, and a step
    # with a draft yields 1 + 12/10 tokens (the verifier's own one counted).
    out = spec_acceptance(10, 30, 12)
    assert out == {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 12,
                   "acceptance_rate": pytest.approx(0.4),
                   "mean_acceptance_length": pytest.approx(2.2)}
    assert spec_acceptance(0, 0, 0) is None  # nothing drafted: not "0% accepted"


def test_server_view_reads_the_spec_counters_before_and_after():
    names = VLLM().metric_names()

    def snap(drafts: int, tokens: int, accepted: int) -> dict[str, Any]:
        return parse(f"vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {drafts}\n"
                     f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {tokens}\n"
                     f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} "
                     f"{accepted}\n")

    w = MetricsWatcher("http://x", names)
    w.first, w.last = snap(5, 15, 3), snap(25, 75, 33)  # the phase: 20, 60, 30
    view = w.report()["spec_decode"]  # type: ignore[index]
    assert view["drafts"] == 20 and view["acceptance_rate"] == pytest.approx(0.5)
    w.first = w.last = snap(5, 15, 3)  # no draft in the phase: no view
    assert "spec_decode" not in w.report()  # type: ignore[operator]


def test_decision_keeps_only_a_gain_beyond_the_noise():
    base = [10.0, 10.2, 9.9, 10.1]
    clear = decide(base, [12.0, 12.3, 11.9, 12.1], maximize=True)
    assert clear["kept"] and clear["gain"] == pytest.approx(1.2, rel=0.02)
    assert clear["gain_ci95"][0] > 1
    noisy = decide(base, [9.0, 11.5, 10.4, 10.0], maximize=True)
    assert not noisy["kept"] and "holds 1" in noisy["why"]
    loses = decide(base, [8.0, 8.1, 7.9, 8.2], maximize=True)
    assert not loses["kept"] and loses["gain"] < 1 and "loses" in loses["why"]
    # A latency: a lower value is the gain.
    faster = decide([100.0, 101, 99, 100], [80.0, 81, 79, 80], maximize=False)
    assert faster["kept"] and faster["gain"] == pytest.approx(1.25, rel=0.02)
    assert not decide(base, [12.0, 12.3, 11.9, 12.1], True, spec_failures=1)["kept"]
    assert not decide(base[:2], [12.0, 12.3], True)["kept"]  # no interval


def _ctx(cpu_host, engine_args: dict[str, Any] | None) -> SpaceContext:
    return SpaceContext(cpu_host, resolve_model(None), _install(), engine_args=engine_args)


def _install() -> Any:
    from qtune.host.installed import EngineInstall

    return EngineInstall("vllm", "0.32.0", "cpu", None)


def test_vllm_candidates_come_from_the_installed_config_classes(cpu_host):
    eng = VLLM()
    cands, notes = eng.speculative(_ctx(cpu_host, {"speculative_config": _V032}))
    assert cands and all(c["speculative_config"]["method"] == "ngram" for c in cands)
    for c in cands:
        s = c["speculative_config"]
        assert s["prompt_lookup_min"] <= s["prompt_lookup_max"]
        assert s["num_speculative_tokens"] >= 1
    text = " ".join(notes)
    assert "draft_model" in text and "eagle" in text and "mtp" in text
    assert "arctic-inference" in text
    # A build whose config accepts no ngram offers nothing, and says why not.
    other = {**_V032, "methods": ["draft_model"]}
    assert eng.speculative(_ctx(cpu_host, {"speculative_config": other}))[0] == []
    # A vLLM without --speculative-config at all.
    none, why = eng.speculative(_ctx(cpu_host, {"max_num_seqs": {}}))
    assert none == [] and "no --speculative-config" in why[0]


def test_the_candidate_goes_to_the_server_as_json(cpu_host):
    info = _V032
    flag = to_flag("speculative_config", {"method": "ngram", "num_speculative_tokens": 3},
                   info)
    assert flag == ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']
    eng = VLLM()
    ctx = _ctx(cpu_host, None)
    bad = {"speculative_config": {"method": "ngram", "prompt_lookup_min": 4,
                                  "prompt_lookup_max": 2}}
    assert any("prompt_lookup_min" in p for p in eng.check(bad, ctx))


class SpecEngine(FakeEngine):
    """A stand-in whose "speculative" candidates change the per-token delay
    (the defaults' is 10 ms): a clearly faster one and a slower one."""

    def __init__(self, delays: tuple[int, ...]) -> None:
        self.delays = delays

    def speculative(self, ctx: SpaceContext) -> tuple[list[dict[str, Any]], list[str]]:
        return [{"delay_ms": d} for d in self.delays], ["draft_model: none here"]

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        return []


@pytest.fixture
def real_weights(monkeypatch):
    import qtune.search.inputs as inputs

    real = inputs.resolve_model
    monkeypatch.setattr(inputs, "resolve_model",
                        lambda spec: dataclasses.replace(real(spec), has_weights=True))


@pytest.mark.measures  # the A/B is judged on measured throughput
def test_phase_keeps_a_clear_win_and_the_profile_says_so(fake, monkeypatch,  # noqa: F811
                                                        real_weights):
    monkeypatch.setitem(ENGINES, "fake", SpecEngine((1, 30)))
    cfg = dataclasses.replace(fake, trials=1, confirm=Confirmation(top=0, repeats=2),
                              study="spec-win")
    res = tune(cfg)
    spec = [t for t in res.trials if t.spec_of is not None]
    assert [t.params for t in spec] == [{"delay_ms": 1}, {"delay_ms": 30}]
    assert all(t.spec_of == 0 for t in spec)
    assert res.best is not None and res.best.params == {"delay_ms": 1}
    profile = Profile.load(res.profile_path)
    phase = profile.metrics["speculative"]
    assert phase["kept"] == res.best.number and phase["compared"] == res.best.number
    assert phase["repeats"] == 3 and len(phase["values"]["0"]) == 3
    assert phase["gain"] > 1 and phase["gain_ci95"][0] > 1
    assert any(n.startswith("speculative decoding: ") and "kept trial" in n
               for n in profile.notes)
    # A resume does not run the phase again.
    res2 = tune(dataclasses.replace(cfg, trials=1))
    assert sum(t.spec_of is not None for t in res2.trials) == 2


@pytest.mark.measures  # the A/B is judged on measured throughput
def test_phase_keeps_the_base_when_the_candidate_loses(fake, monkeypatch,  # noqa: F811
                                                       real_weights):
    # 14 ms a token against the base's 10: slower, but within the pruning
    # margin, so it runs in full and loses in the A/B.
    monkeypatch.setitem(ENGINES, "fake", SpecEngine((14,)))
    res = tune(dataclasses.replace(fake, trials=1, confirm=Confirmation(top=0), study="spec-lose",
                                   prune_margin=1.0))
    assert res.best is not None and res.best.number == 0  # the base config
    phase = Profile.load(res.profile_path).metrics["speculative"]
    assert phase["kept"] is None and phase["gain"] < 1
    assert "not kept" in summary_line(phase)


def test_a_candidate_runs_in_full_even_when_it_cannot_win(
        fake, monkeypatch, real_weights):  # noqa: F811
    """30 ms a token against the base's 10: a trial the pruner would stop,
    but a candidate is measured in full (its acceptance is what it is for)
    and loses in the A/B."""
    monkeypatch.setitem(ENGINES, "fake", SpecEngine((30,)))
    res = tune(dataclasses.replace(fake, trials=1, confirm=Confirmation(top=0), study="spec-prune"))
    assert res.best is not None and res.best.number == 0
    cand = next(t for t in res.trials if t.spec_of is not None)
    assert cand.status == "ok" and cand.summary is not None
    phase = Profile.load(res.profile_path).metrics["speculative"]
    assert phase["kept"] is None and phase["compared"] == cand.number
    assert phase["gain"] < 1


def test_phase_is_skipped_on_random_weights_and_when_off(fake, monkeypatch):  # noqa: F811
    monkeypatch.setitem(ENGINES, "fake", SpecEngine((1,)))
    res = tune(dataclasses.replace(fake, trials=1, confirm=Confirmation(top=0), study="spec-dummy"))
    assert all(t.spec_of is None for t in res.trials)
    phase = Profile.load(res.profile_path).metrics["speculative"]
    assert phase["searched"] is False and "random weights" in phase["why"]
    off = tune(dataclasses.replace(fake, trials=1, confirm=Confirmation(top=0), study="spec-off",
                                   speculative="off"))
    assert Profile.load(off.profile_path).metrics.get("speculative") is None
