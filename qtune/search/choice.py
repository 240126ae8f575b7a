"""The engine as a choice (``--engine a,b``): the study's categorical
parameter ``engine`` and each engine's own parameters under its name
(``sglang.max_running_requests``), suggested only on that engine's trials,
so TPE (``group=True``) models each engine's sub-space apart; and each
engine's best against the others' (``engine_summary``).

A study of one engine has neither: its trials' params are the engine's own
names, as they always were."""

from __future__ import annotations

from typing import Any, cast

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from qtune.params import JSONObject, Params
from qtune.search.inputs import Prepared
from qtune.search.records import (
    Attr,
    StudyAttr,
    TrialRecord,
    TrialStatus,
    maximizes,
    ran_trials,
)
from qtune.search.space import distributions, tidy

ENGINE_PARAM = "engine"


def qualified(engine: str, name: str) -> str:
    """An engine's parameter as the study names it: two engines may share a
    flag name with different ranges (Optuna keeps one distribution a name)."""
    return f"{engine}.{name}"


def own_params(engine: str, params: Params) -> Params:
    """``engine``'s values among a trial's params, under the engine's names."""
    head = engine + "."
    return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}


def _suggest(trial: optuna.Trial, name: str, d: BaseDistribution) -> Any:
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    if isinstance(d, FloatDistribution):
        return trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
    raise TypeError(f"no suggestion for {type(d).__name__}")


def suggest(prep: Prepared, trial: optuna.Trial) -> tuple[Prepared, Params]:
    """A sampled trial of a study across engines: the engine first, then
    that engine's parameters only.  Returns the engine's prepared study and
    the values under its own names (tidied, without its fixed params)."""
    engine = trial.suggest_categorical(ENGINE_PARAM, list(prep.engines))
    sub = prep.engines[str(engine)]
    trial.set_user_attr(Attr.ENGINE, sub.engine.name)
    for name, d in distributions(sub.params).items():
        _suggest(trial, qualified(sub.engine.name, name), d)
    return sub, tidy(own_params(sub.engine.name, trial.params), sub.params)


def design_point(engine: str, point: Params) -> Params:
    """A start-design point of ``engine`` as the study enqueues it."""
    return {ENGINE_PARAM: engine, **{qualified(engine, k): v for k, v in point.items()}}


def engine_summary(study: optuna.Study) -> list[JSONObject] | None:
    """Each engine's best fully measured feasible trial against the others'
    on the study's one workload (None for a study of one engine): its
    trial and value (the confirmation median when it was re-measured), its
    own defaults' value, and ``vs_best``, how far its value is from the best
    engine's (1.0: the best; 1.25: 25% worse, in the objective's sense).
    An engine with no feasible trial has ``trial`` None."""
    names = study.user_attrs.get(StudyAttr.ENGINES)
    if not names:
        return None
    larger = maximizes(study)
    sign = -1 if larger else 1
    conf = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    recs = [TrialRecord.from_frozen(t) for t in ran_trials(study)
            if t.state == TrialState.COMPLETE]
    rows = []
    for name in names:
        mine = [r for r in recs if r.engine == name and r.feasible and r.value is not None
                and r.status == TrialStatus.OK and r.spec_of is None]

        def value(r: TrialRecord) -> float:
            c = conf.get(str(r.number))
            return float(c["median"] if c else r.value)  # type: ignore[arg-type]

        best = min(mine, key=lambda r: sign * value(r)) if mine else None
        base = next((r for r in mine if r.baseline), None)
        rows.append({"engine": name, "trial": best.number if best else None,
                     "value": value(best) if best else None,
                     "basis": ("median of the confirmation runs"
                               if best and str(best.number) in conf else "one run"),
                     "params": dict(best.params) if best else None,
                     "baseline_trial": base.number if base else None,
                     "baseline_value": value(base) if base else None,
                     **({"bracket": b} if best and (b := _bracket(best, conf)) else {})})
    values = [r["value"] for r in rows if r["value"] is not None]
    top = (max if larger else min)(values) if values else None
    for r in rows:
        v = r["value"]
        r["vs_best"] = (None if v is None or top is None or not v or not top
                        else round(top / v if larger else v / top, 4))
        if "bracket" in r and top is not None and v != top:
            # A capacity is a bracket [held, failed): an engine is measured
            # below the best only if it failed at a load the best held.  On
            # one H200, SGLang's defaults held 20 and failed only at 30, vLLM's
            # held 27.5: "1.38x" was the search's resolution, not a gap.
            failed_at = r["bracket"][1]
            r["separated"] = failed_at is not None and failed_at <= top
    return rows


def _bracket(r: TrialRecord, conf: dict[str, Any]) -> list[float | None] | None:
    """A capacity trial's [highest load held, lowest load that failed above
    it]: the confirmation's, once its fresh starts ran (a load held once in
    the search may have failed there), else the search's."""
    b = ((conf.get(str(r.number)) or {}).get("bracket")
         or ((r.summary or {}).get("capacity") or {}).get("bracket"))
    return list(b) if b else None


def summary_lines(rows: list[JSONObject]) -> list[str]:
    """``engine_summary`` as text, one engine a line: ``qtune report``, the
    HTML report and the profile's note."""
    out = []
    top = next((r["value"] for r in rows if r["vs_best"] == 1.0), None)
    for r in rows:
        if r["trial"] is None:
            out.append(f"{r['engine']}: no feasible trial")
            continue
        base = ("" if r["baseline_value"] is None
                else f", its defaults {r['baseline_value']:.4g}")
        rel = "best" if r["vs_best"] == 1.0 else f"{r['vs_best']:.2f}x the best"
        value = f"{r['value']:.4g}"
        if "bracket" in r:
            # engine_summary's [held, failed) (``_bracket``)
            held, failed = cast("list[float | None]", r["bracket"])
            value += f" [{held:.4g}, {'-' if failed is None else f'{failed:.4g}'})"
            if r.get("separated") is False:
                rel += (f", not separated from it: failed only at {failed:.4g}, above the "
                        f"best's {top:.4g}" if failed is not None
                        else ", not separated from it: held every load tried")
        out.append(f"{r['engine']}: trial {r['trial']} {value} ({r['basis']}; "
                   f"{rel}){base}")
    return out
