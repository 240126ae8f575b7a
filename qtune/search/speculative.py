"""The speculative-decoding phase: after the main search (and the top-K
confirmation) has chosen the base config, the engine's speculative decoding
candidates (``Engine.speculative``) run on top of it, as trials of their own
(their acceptance rate read from the engine's counters, the quality gate
applied), and the best of them is compared with the base config in
interleaved repeats with fresh prompts.  It is kept only when it wins beyond
the noise; the study records the gain or loss with its interval either way.

Why after, and on the best base config only (as SGLang's auto-benchmark
does): what a draft gains depends on the batch the base config reaches (a
verifying step costs little more than a decode step only while the step is
not compute bound), so it is measured where it would be deployed.  Why only
with real weights: random weights make the acceptance rate meaningless.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import optuna

from qtune.params import JSONObject, JSONValue, Params, ParamValue
from qtune.search.fresh import remeasure
from qtune.search.inputs import Prepared
from qtune.search.records import Attr, StudyAttr, TrialRecord, TrialStatus
from qtune.search.reporter import Reporter
from qtune.search.result import summary_line, winner
from qtune.seeds import Phase
from qtune.stats import bootstrap_median, ratio_ci

# Launches a trial no sampler chose: (params, attrs, note), the runner's
# _run_unsampled.
Launch = Callable[[Params, JSONObject, str], None]



def spec_view(summary: Mapping[str, JSONValue] | None) -> JSONObject | None:
    """A run's speculative-decoding figures from its server view (None when
    the server drafted nothing or was not read)."""
    # the server's /metrics view (qtune.load.prometheus), an object
    server = cast("Mapping[str, JSONValue]", (summary or {}).get("server") or {})
    view = server.get("spec_decode")
    return view if isinstance(view, dict) else None


def describe(added: Mapping[str, ParamValue]) -> str:
    """A candidate in one line: what it adds to the base config, a nested
    setting's fields spelled out (``method=ngram num_speculative_tokens=3``)."""
    return " ".join(f"{k}={v}" for key, val in added.items()
                    for k, v in (val.items() if isinstance(val, Mapping)
                                 else [(key, val)]))


def _added(params: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if base.get(k) != v}


def decide(base: list[float], spec: list[float], maximize: bool,
           spec_failures: int = 0) -> JSONObject:
    """Keep speculative decoding only when its gain over the base config is
    beyond the noise: the bootstrap 95% interval of the ratio of medians
    (in the objective's sense, > 1 better) lies above 1, and no round of it
    failed.  Under 3 values each there is no interval, and nothing is kept."""
    r = ratio_ci(base, spec)
    ratio, ci = r["ratio"], r["ci95"]
    if not maximize:  # a latency: the base's over the candidate's is the gain
        ratio = 1 / ratio if ratio else float("nan")
        ci = [1 / ci[1], 1 / ci[0]] if ci and ci[0] > 0 else None
    if spec_failures:
        why = f"{spec_failures} of its rounds failed"
    elif ci is None:
        why = "too few rounds for an interval (3 each needed)"
    elif ci[0] > 1:
        why = "its gain's interval lies above 1"
    elif ci[1] < 1:
        why = "it loses: its interval lies below 1"
    else:
        why = "its interval holds 1: no gain beyond the noise"
    return {"gain": ratio, "gain_ci95": ci,
            "kept": bool(not spec_failures and ci is not None and ci[0] > 1),
            "why": why}


def speculative_phase(prep: Prepared, study: optuna.Study, reporter: Reporter,
                      launch: Launch, budget_left: float | None = None,
                      typical_s: float = 0.0) -> None:
    """Run the phase once per study (a resumed or ``--finish`` run finds it
    recorded) and record it in the study's ``speculative`` attribute.
    ``budget_left``: seconds of the time budget left (None: no budget);
    ``typical_s``: what one trial takes, to see whether the phase fits."""
    cfg = prep.cfg
    if cfg.speculative == "off" or cfg.pick is not None or prep.direction == "pareto" \
            or StudyAttr.SPECULATIVE in study.user_attrs:
        return

    def record(out: JSONObject) -> None:
        study.set_user_attr(StudyAttr.SPECULATIVE, out)
        reporter.note("speculative decoding: " + summary_line(out))

    if prep.ctx.model.load_format == "dummy":
        record({"searched": False, "why": "not searched: random weights (--load-format "
                "dummy) make the acceptance rate meaningless"})
        return
    candidates, notes = prep.engine.speculative(prep.ctx)
    for n in notes:
        reporter.note(f"speculative decoding: {n}")
    base = winner(study)
    if base is None or base.status != TrialStatus.OK:
        record({"searched": False, "why": "no feasible base config", "notes": notes})
        return
    if not candidates:
        record({"searched": False, "why": "no method of the engine can run here",
                "notes": notes})
        return
    repeats = max(3, cfg.confirm.repeats + 1)
    need = (len(candidates) + 2 * repeats) * typical_s
    if budget_left is not None and need > budget_left:
        # Not recorded: a resumed study with more time may still run it.
        reporter.note(f"speculative decoding not searched: it needs ~{need / 60:.0f} "
                      "min, more than the time budget has left")
        return
    ran = _launch_candidates(prep, study, base, candidates, notes, launch)
    out: dict[str, Any] = {
        "searched": True, "base_trial": base.number, "notes": notes,
        "candidates": [{"trial": r.number,
                        "config": describe(_added(r.params, base.params)),
                        "status": str(r.status), "reason": r.reason, "value": r.value,
                        "feasible": r.feasible, "spec_decode": spec_view(r.summary)}
                       for r in ran]}
    record({**out, **_compared(prep, base, ran, repeats, reporter)})


def _launch_candidates(prep: Prepared, study: optuna.Study, base: TrialRecord,
                       candidates: list[dict[str, Any]], notes: list[str],
                       launch: Launch) -> list[TrialRecord]:
    """Each method the engine offers, on the winner's config, as a trial of
    its own; one the engine refuses is a note, not a launch."""
    ran: list[TrialRecord] = []
    for cand in candidates:
        params = {**base.params, **cand}
        if problems := prep.engine.check(params, prep.ctx):
            notes.append(f"{describe(cand)}: refused: {'; '.join(problems)}")
            continue
        launch(params, {Attr.SPEC_OF: base.number},
               f"speculative decoding on trial {base.number}: {describe(cand)}")
        ran.append(next(TrialRecord.from_frozen(t)
                        for t in reversed(study.get_trials(deepcopy=False))
                        if t.user_attrs.get(Attr.SPEC_OF) == base.number))
    return ran


def _compared(prep: Prepared, base: TrialRecord, ran: list[TrialRecord], repeats: int,
              reporter: Reporter) -> dict[str, Any]:
    """The best candidate and its base, A/B on fresh starts (``repeats``
    rounds), and whether it is kept; none when no candidate ran feasibly."""
    fit = [r for r in ran if r.feasible and r.value is not None
           and r.status == TrialStatus.OK]
    if not fit:
        return {"kept": None, "why": "no candidate ran in full and feasibly"}
    maximize = prep.direction == "maximize"
    sign = -1 if maximize else 1
    best = min(fit, key=lambda r: sign * r.value)  # type: ignore[operator]
    values, failures, accept = _ab(prep, [base, best], repeats, reporter)
    verdict = decide(values[base.number], values[best.number], maximize,
                     failures[best.number])
    return {"compared": best.number, "repeats": repeats,
            "values": {str(k): v for k, v in values.items()},
            "medians": {str(k): bootstrap_median(v)[0] for k, v in values.items() if v},
            "failures": {str(k): v for k, v in failures.items()},
            "round_acceptance": accept, **verdict,
            "kept": best.number if verdict["kept"] else None}


# 3 rounds each at least (see speculative_phase): the fewest that give the
# ratio an interval.
def _ab(prep: Prepared, items: list[TrialRecord], repeats: int, reporter: Reporter
        ) -> tuple[dict[int, list[float]], dict[int, int], list[float | None]]:
    """Each item re-measured ``repeats`` times with a fresh start, in
    rotated order (``interleaved``), each round's prompts fresh: the
    objective's values, failed rounds per item, and the candidate's
    acceptance rate per round (the last item)."""
    accept: list[float | None] = []

    def acceptance(r: TrialRecord, summary: JSONObject) -> None:
        if r is items[-1]:
            view = spec_view(summary)
            # the engine's acceptance rate (qtune.metrics.spec_acceptance)
            accept.append(cast(float, view["acceptance_rate"]) if view else None)

    values, failures = remeasure(prep, items, repeats, reporter, phase="speculative A/B",
                                 log_name="spec-ab", seed_phase=Phase.SPECULATIVE,
                                 on_run=acceptance)
    return values, failures, accept
