"""``qtune search --engine vllm,sglang`` end to end through the replay
stand-in (``qtune.search.replay``): qtune's own search, confirmation and
profile run, only the measurement is replaced.

SYNTHETIC: every run below is made up for this test, none was measured.  No
second engine runs on this machine, so the table is written by hand: a
summary of a measured vLLM CPU run (``benchmarks/results/replay-table-
20261201``) with its ``e2e_ms`` replaced by invented values.  It is built so
that the answer is known whatever the sampler does: the SGLang defaults
already beat every vLLM config, so the winner must be an SGLang trial.

The SGLang adapter's arguments are the captured ones of SGLang 0.5.17
(tests/engines/fixtures/); each engine's space is cut to one parameter of
three values so that the table covers every config the search can launch."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from qtune.engines import ENGINES
from qtune.engines import probe_host as probe
from qtune.engines.base import Param
from qtune.errors import StudyError
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.measure import replace_measure_server
from qtune.options import Confirmation, grouped
from qtune.profile import Profile
from qtune.search.choice import ENGINE_PARAM
from qtune.search.config import TuneConfig
from qtune.search.inputs import prepare
from qtune.search.records import Attr, StudyAttr
from qtune.search.replay import StandIn, Table
from qtune.search.reporter import NullReporter
from qtune.search.runner import run_study
from qtune.search.storage import open_storage
from tests.engines.conftest import ENG_FIX, H200X2, replay_nvml

ROOT = Path(__file__).parents[2]
MEASURED = ROOT / "tests" / "fixtures" / "replay-table-20261201"
SGLANG_ARGS = json.loads((ENG_FIX / "sglang-0.5.17-server-args.json").read_text())
VLLM_ARGS = {"max_num_seqs": {"flag": "--max-num-seqs", "kind": "int", "default": None,
                              "choices": None, "nargs": None}}
# The one tuned parameter of each engine and its values (the cut space).
TUNED = {"vllm": "max_num_seqs", "sglang": "max_running_requests"}
VALUES = (64, 128, 256)
# SYNTHETIC e2e p50 (ms) per config (None: the engine defaults), two runs
# each: every SGLang config beats every vLLM one, SGLang at 128 is best.
SYNTHETIC_E2E = {
    "vllm": {None: (2000, 2100), 64: (1900, 1950), 128: (1700, 1750), 256: (1800, 1850)},
    "sglang": {None: (1500, 1550), 64: (1400, 1450), 128: (1000, 1040),
               256: (1200, 1230)},
}


def synthetic_table(engine: str, template: dict[str, Any]) -> Table:
    """SYNTHETIC: ``engine``'s configs with invented e2e p50s on a measured
    summary; no samples, so no run is ever cut short by the pruner."""
    rows = []
    for value, e2es in SYNTHETIC_E2E[engine].items():
        params = {} if value is None else {TUNED[engine]: value}
        for e2e in e2es:
            summary = copy.deepcopy(template)
            summary["e2e_ms"] = {**summary["e2e_ms"], "p50": float(e2e)}
            rows.append({"params": params, "summary": summary, "samples": [],
                         "startup_s": 30.0, "measure_s": 20.0})
    meta = {"objective": "e2e_p50", "direction": "minimize", "tuned": [TUNED[engine]],
            "synthetic": True}
    return Table.from_rows(meta, rows)


@dataclasses.dataclass
class Setup:
    cfg: TuneConfig
    tables: dict[str, Table]


@pytest.fixture
def setup(monkeypatch, tmp_path) -> Setup:
    import qtune.search.inputs as inputs

    installs = [EngineInstall("vllm", "0.32.0", "cuda", sys.executable),
                EngineInstall("sglang", "0.5.17", "cuda", sys.executable)]
    host = dataclasses.replace(
        probe(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable),
        engines=InstalledEngines(sys.executable, installs))
    monkeypatch.setattr(inputs, "probe", lambda **kw: host)
    for name, args in (("vllm", VLLM_ARGS), ("sglang", SGLANG_ARGS)):
        engine = ENGINES[name]
        space = [Param(TUNED[name], "choice", choices=VALUES)]
        monkeypatch.setattr(engine, "read_args", lambda install, args=args: args)
        monkeypatch.setattr(engine, "space", lambda ctx, space=space: list(space))
        # The table's space as it is: no seeds, nothing cut by the load.
        monkeypatch.setattr(engine, "seeds", lambda params, ctx, fixed: [])
        monkeypatch.setattr(engine, "shape", lambda params, ctx, load: (params, {}, []))
    meta = json.loads((MEASURED / "meta.json").read_text())
    first = json.loads((MEASURED / "runs.jsonl").read_text().splitlines()[0])
    cfg = TuneConfig(
        engine="vllm,sglang", model=None,  # the embedded tiny model (random weights)
        workload=Workload(**meta["workload"]), objective="e2e_p50", trials=8,
        confirm=Confirmation(top=2, repeats=1), studies_dir=tmp_path / "studies",
        profiles_dir=tmp_path / "profiles", study="two-engines")
    return Setup(cfg, {n: synthetic_table(n, first["summary"]) for n in TUNED})


def run(setup: Setup, **over: Any) -> tuple[Any, list[tuple[str, str]]]:
    """The study run with every measurement answered from the synthetic
    tables; returns the result and each launch's (engine, table key)."""
    prep = prepare(dataclasses.replace(setup.cfg, **grouped(over)))
    stands = {n: StandIn(setup.tables[n], _spec_of(prep.engines.get(n, prep)),
                         random.Random(0))
              for n in TUNED}
    launched = []

    def answer(spec: Any, log: Path, bench: Any, **kw: Any) -> Any:
        n = "sglang" if "sglang" in " ".join(spec.argv) else "vllm"
        launched.append((n, stands[n].key_of(spec)))
        return stands[n].measure(spec, watch=kw.get("watch"), on_ready=kw.get("on_ready"),
                                 before=kw.get("before"))

    with replace_measure_server(answer):
        res = run_study(prep, NullReporter())
    return res, launched


def _spec_of(prep: Any) -> Any:
    return lambda params: prep.engine.launch_spec(params, prep.ctx, host="127.0.0.1",
                                                  port=0)


def study_of(setup: Setup) -> optuna.Study:
    url = f"journal://{setup.cfg.studies_dir / 'two-engines.log'}"
    return optuna.load_study(study_name="two-engines", storage=open_storage(url))


def test_both_engines_defaults_run_first_then_one_search_across_both(setup):
    res, launched = run(setup)
    # --trials counts the whole study's launches; the confirmation comes after.
    search = launched[:setup.cfg.trials]
    assert search[:2] == [("vllm", ""), ("sglang", "")]  # each engine's defaults
    assert {n for n, _ in search[2:]} == {"vllm", "sglang"}  # the design starts both
    trials = [t for t in study_of(setup).trials if Attr.SERVER_OF not in t.user_attrs]
    for t in trials:
        engine = t.user_attrs[Attr.ENGINE]
        # Each trial holds its own engine's params only (the conditional space).
        sampled = {k for k in t.params if k != ENGINE_PARAM}
        assert sampled <= {f"{engine}.{TUNED[engine]}"}
        if not t.user_attrs.get(Attr.BASELINE):
            assert t.params[ENGINE_PARAM] == engine and sampled
            assert t.user_attrs[Attr.LAUNCH_PARAMS] == \
                {TUNED[engine]: t.params[f"{engine}.{TUNED[engine]}"]}


def test_the_answer_can_be_the_other_engine_with_its_flags(setup, tmp_path):
    res, launched = run(setup)
    # SYNTHETIC table: the SGLang defaults beat every vLLM config.
    assert res.best is not None and res.best.engine == "sglang"
    prof = Profile.load(res.profile_path)
    assert prof.engine.name == "sglang" and prof.engine.version == "0.5.17"
    assert "sglang" in " ".join(prof.argv) and "--max-num-seqs" not in prof.argv
    # the improvement is over the winner's own engine's defaults
    assert res.baseline is not None and res.baseline.engine == "sglang"
    assert prof.study.baseline_trial == res.baseline.number
    # the per-engine summary: each engine's best against the others
    rows = {r["engine"]: r for r in prof.metrics["engines"]}
    assert list(rows) == ["vllm", "sglang"]
    assert rows["sglang"]["vs_best"] == 1.0 and rows["vllm"]["vs_best"] > 1.0
    assert rows["sglang"]["trial"] == res.best.number
    for name, row in rows.items():
        ran = [v for n, k in launched[:setup.cfg.trials] if n == name
               for v in SYNTHETIC_E2E[name][int(k.split("=")[1]) if k else None]]
        assert min(ran) <= row["value"] <= max(ran)
    assert any("searched across engines (vllm, sglang)" in n for n in prof.notes)


def test_the_confirmation_re_measures_each_trial_with_its_own_engine(setup):
    res, launched = run(setup)
    conf = study_of(setup).user_attrs[StudyAttr.CONFIRMATION]
    recs = {t.number: t for t in res.trials}
    confirmed = launched[setup.cfg.trials:]
    assert len(confirmed) == len(conf) >= 2
    for n in conf:  # the defaults of each engine in the top 2 are re-measured too
        assert recs[int(n)].engine in {e for e, _ in confirmed}
    assert any(recs[int(n)].baseline and recs[int(n)].engine == "sglang" for n in conf)


def test_a_resume_runs_no_defaults_twice_and_keeps_the_engines(setup):
    run(setup, trials=4, confirm_top=0)
    _, launched = run(setup, trials=6, confirm_top=0)
    assert len(launched) == 2 and ("vllm", "") not in launched \
        and ("sglang", "") not in launched
    with pytest.raises(StudyError, match="was run with --engine vllm,sglang, not vllm"):
        run(setup, engine="vllm")



def test_qtune_report_and_the_html_report_show_each_engine_s_best(setup, tmp_path,
                                                                  monkeypatch):
    import io

    from qtune import console
    from qtune.report import report

    res, _ = run(setup)
    url = f"journal://{setup.cfg.studies_dir / 'two-engines.log'}"
    html = tmp_path / "r.html"
    out = report("two-engines", url, html_path=html)
    assert out["engines"] == res.engines and out["best_trial"] == res.best.number
    assert {r["engine"] for r in out["trials"]} == {"vllm", "sglang"}
    page = html.read_text()
    assert "<h2>Engines</h2>" in page
    assert f"sglang: trial {res.best.number} " in page and "vllm: trial " in page
    buf = io.StringIO()
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=200))
    console.render_report(out)
    console.render_search_result(res)
    text = buf.getvalue()
    assert text.count("each engine's best on this workload:") == 2
    assert text.count(f"  sglang: trial {res.best.number} ") == 2
    assert "sglang: engine defaults" in text  # the trials name their engine


def test_a_study_of_one_engine_has_no_engine_parameter_attribute_or_summary(
        monkeypatch, cpu_host, tmp_path):
    from qtune.search.replay import replay_search
    from tests.search.test_replay import build_tiny

    tiny = build_tiny(monkeypatch, cpu_host, tmp_path)
    assert tiny.prep.engines == {}
    out = replay_search(tiny.prep, tiny.table, "tpe+confirm", 12, 0, tiny.work)
    assert out.pick is not None
    study = optuna.load_study(study_name="tpe-confirm-b12-s0", storage=open_storage(
        f"journal://{tiny.work / 'tpe-confirm-b12-s0.log'}"))
    assert StudyAttr.ENGINES not in study.user_attrs
    for t in study.trials:
        assert ENGINE_PARAM not in t.params and Attr.ENGINE not in t.user_attrs
        assert all("." not in k for k in t.params)  # the engine's own names
    prof = Profile.load(next((tmp_path / "profiles").glob("*.yaml")))
    assert "engines" not in prof.metrics
    assert not any("across engines" in n for n in prof.notes)
