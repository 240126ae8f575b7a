"""What a study found: the winner (one rule for the search and ``qtune
report``), the Pareto front and its knee, the profile, the trials table."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna

from qtune import __version__
from qtune.engines import gpus_used
from qtune.errors import InputError, mask_url, redact
from qtune.files import csv_text, write_atomic
from qtune.host import placement
from qtune.metrics import overload_text
from qtune.objectives import pareto_latency
from qtune.params import JSONObject, JSONValue
from qtune.profile import EngineInfo, Profile, StudyRef
from qtune.quality import Quality
from qtune.search.choice import engine_summary, summary_lines
from qtune.search.fleet import FleetAttr
from qtune.search.gain import ObjectivePair, gain_of, objective_pair
from qtune.search.inputs import Prepared, at_load
from qtune.search.records import (
    BELOW,
    LAUNCHED,
    Attr,
    StudyAttr,
    TrialRecord,
    TrialStatus,
    maximizes,
    ran_trials,
)

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TuneResult:
    study_name: str
    storage: str
    best: TrialRecord | None
    baseline: TrialRecord | None
    trials: list[TrialRecord]
    profile_path: Path | None
    profile: Profile | None
    improvement: float | None  # best vs baseline, in the objective's sense
    memory_estimate: dict[str, Any] | None = None  # prediction vs launches
    pruning: dict[str, Any] | None = None  # trials stopped early, time saved
    stop_reason: str | None = None  # why fewer than --trials were launched
    pareto_front: list[dict[str, Any]] | None = None  # --objective pareto
    engines: list[dict[str, Any]] | None = None  # --engine a,b: each one's best


def estimate_accuracy(trials: list[TrialRecord], attrs: Mapping[int, JSONObject]
                      ) -> dict[str, int]:
    """How the memory prediction compared with what launches did
    (``attrs``: each trial's user attributes, by trial number)."""
    launched = [t for t in trials
                if t.status in LAUNCHED
                and Attr.MEMORY_ESTIMATE in attrs.get(t.number, {})]
    right = sum(1 for t in launched
                if _predicted_fit(attrs[t.number]) == (t.reason != "oom"))
    return {
        "launches_avoided": sum(1 for t in trials if t.reason == "predicted_oom"),
        "launched_with_prediction": len(launched),
        "prediction_right": right,
        "oom_at_start_despite_fit": sum(
            1 for t in launched
            if t.reason == "oom" and _predicted_fit(attrs[t.number])),
    }


def _predicted_fit(attrs: JSONObject) -> JSONValue:
    """Whether a trial's memory estimate said it fits (``Estimate.as_dict``)."""
    return cast("Mapping[str, JSONValue]", attrs[Attr.MEMORY_ESTIMATE])["fits"]


def best_trial(study: optuna.Study, pick: int | None = None) -> TrialRecord | None:
    """The best feasible trial; ``pick`` chooses one by number instead.  For
    a Pareto study, the knee of the front (see ``knee``)."""
    recs = [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]
    feas = [r for r in recs if r.feasible and r.value is not None]
    if pick is not None:
        return next((r for r in feas if r.number == pick and r.status == TrialStatus.OK), None)
    # A speculative candidate wins only through its phase's A/B (winner).
    feas = [r for r in feas if r.spec_of is None]
    if not feas:
        return None
    if len(study.directions) > 1:
        return knee(pareto_front(feas))
    sign = -1 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1
    return min(feas, key=lambda r: sign * r.value)  # type: ignore[operator]


def winner(study: optuna.Study, pick: int | None = None) -> TrialRecord | None:
    """The trial a study's profile is written from, for the search and
    ``qtune report`` alike: trial ``pick`` when given; else, once the top
    configs were re-measured, the best *median* over the confirmation
    repeats; else the best single run (``best_trial``)."""
    best = best_trial(study, pick)
    kept = (study.user_attrs.get(StudyAttr.SPECULATIVE) or {}).get("kept")
    if pick is None and kept is not None:
        # Speculative decoding beat the base config in interleaved repeats.
        return next((TrialRecord.from_frozen(t) for t in ran_trials(study)
                     if t.number == kept), best)
    confirmation = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    if best is None or not confirmation or pick is not None:
        return best
    sign = -1 if maximizes(study) else 1
    # A config whose re-run failed (start or requests) cannot win while
    # another re-ran cleanly.
    clean = [k for k, c in confirmation.items() if not c.get("failures")]
    baseline = {str(t.number) for t in ran_trials(study) if t.user_attrs.get(Attr.BASELINE)}
    # On a tie the engine defaults win: nothing was gained by changing them
    # (a capacity study's defaults that hold the best config's load tie it).
    n = min(clean or list(confirmation),
            key=lambda k: (sign * confirmation[k]["median"], k not in baseline))
    return next(TrialRecord.from_frozen(t) for t in ran_trials(study) if t.number == int(n))


def pareto_front(recs: list[TrialRecord]) -> list[TrialRecord]:
    """Trials no other trial beats on both throughput and latency, by
    throughput (ascending)."""
    pts = [r for r in recs if r.values]
    front = [r for r in pts if not any(
        o.values[0] >= r.values[0] and o.values[1] <= r.values[1]  # type: ignore[index]
        and o.values != r.values for o in pts)]
    return sorted(front, key=lambda r: r.values[0])  # type: ignore[index]


def knee(front: list[TrialRecord]) -> TrialRecord | None:
    """The front point with the most throughput for its latency: the largest
    normalised throughput minus normalised latency.  The ends of the front
    (all throughput, or all latency) are what ``--pick`` is for."""
    if not front:
        return None
    thr = [r.values[0] for r in front]  # type: ignore[index]
    lat = [r.values[1] for r in front]  # type: ignore[index]

    def norm(v: float, vs: list[float]) -> float:
        return (v - min(vs)) / (max(vs) - min(vs)) if max(vs) > min(vs) else 0.0

    best = max(range(len(front)), key=lambda i: norm(thr[i], thr) - norm(lat[i], lat))
    return front[best]


def finish(prep: Prepared, study: optuna.Study) -> TuneResult:
    cfg = prep.cfg
    trials = [TrialRecord.from_frozen(t) for t in ran_trials(study)]
    _export_trials(study, prep.study_dir / "trials.csv")
    best = winner(study, cfg.pick)
    feasible = [r for r in trials if r.feasible and r.status == TrialStatus.OK]
    front = pareto_front(feasible) if prep.direction == "pareto" else []
    front_view = _front_view(front, pareto_latency(cfg.objective) or "") if front else None
    if cfg.pick is not None and best is None:
        choices = [r.number for r in (front or feasible)]
        raise InputError(
            f"--pick {cfg.pick}: trial {cfg.pick} of study {prep.study_name} is not a "
            "fully measured, feasible trial",
            hint=("pick one of trials " + ", ".join(map(str, choices))) if choices
            else "no trial can be picked yet: run more trials",
        )
    baseline = baseline_for(trials, best)
    pair: ObjectivePair = objective_pair(study, best, baseline) if best is not None else {}
    improvement = None
    if best and baseline and baseline.value and best.value is not None:
        improvement = gain_of(pair, minimize=prep.direction in ("minimize", "pareto"))
    profile = path = None
    engines = engine_summary(study)
    if best is not None:
        # (a TypedDict reads as Mapping[str, object]; its values are JSON)
        objective = {**cast("dict[str, JSONValue]", pair), "improvement": improvement}
        profile = build_profile(prep.of(best.engine), study, best, baseline, len(trials),
                                objective, front_view, engines)
        # absolute(), not resolve(): a link is refused (checked), not followed.
        path = (cfg.out or (cfg.profiles_dir / f"{prep.study_name}.yaml")).absolute()
        write_atomic(path, profile.dump(), force=cfg.force, what="--out")
        if cfg.out is not None and cfg.pick is None:  # (--pick reads the study only)
            study.set_user_attr(StudyAttr.PROFILE, str(path))
    attrs = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    accuracy = estimate_accuracy(trials, attrs)
    # Saved time, estimated: the share of each pruned trial's requests never
    # sent, times what a full measurement takes (median over unpruned trials).
    full = sorted(t.measure_s for t in trials
                  if t.status == TrialStatus.OK and t.measure_s and t.server_of is None)
    typical = full[len(full) // 2] if full else 0.0
    unsent = [a[Attr.REQUESTS_UNSENT] for a in attrs.values() if Attr.REQUESTS_UNSENT in a]
    pruning = {"pruned": len(unsent),
               "measure_s_saved": round(sum(unsent) * typical, 3)}
    caps = [(t.summary or t.partial_summary or {}).get("capacity") or {} for t in trials]
    if any(caps):
        # --objective capacity: configs decided by one probe at the best
        # capacity so far, and what stopping failed probes early saved.
        pruning["below_incumbent"] = sum(1 for t in trials if t.reason == BELOW)
        pruning["probes"] = sum(len(c.get("steps") or []) for c in caps)
        pruning["probe_s_saved"] = round(sum(c.get("saved_s") or 0.0 for c in caps), 3)
    return TuneResult(prep.study_name, prep.storage_url, best, baseline, trials,
                      path, profile, improvement, accuracy, pruning, pareto_front=front_view,
                      engines=engines)


def baseline_for(trials: list[TrialRecord], best: TrialRecord | None
                 ) -> TrialRecord | None:
    """The engine defaults' trial the winner is compared with: with
    --levels, at the winner's own load; with --engine a,b, of its engine."""
    level = best.load_level if best is not None else None
    engine = best.engine if best is not None else None
    baseline = next((r for r in trials if r.baseline and r.status == TrialStatus.OK
                     and r.load_level == level and r.engine == engine), None)
    return baseline or next((r for r in trials if r.baseline and r.engine == engine), None)


def _front_view(front: list[TrialRecord], latency: str) -> list[dict[str, Any]]:
    return [{"trial": r.number, "throughput": r.values[0],  # type: ignore[index]
             latency: r.values[1], "params": r.params,  # type: ignore[index]
             **({"load": r.load_level} if r.load_level is not None else {})}
            for r in front]


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """The trials as a table: the CSV next to the study and `qtune report`'s."""
    import pandas as pd

    trials = ran_trials(study)
    # A fleet: the trial a dead worker left is re-run by another (its
    # retry_of); the left one has no record of its own, only the retry's
    # reason, which it is shown with instead of status "unknown".
    retried_by = {t.user_attrs[FleetAttr.RETRY_OF]: t for t in trials
                  if isinstance(t.user_attrs.get(FleetAttr.RETRY_OF), int)}
    fleet = any(FleetAttr.WORKER in t.user_attrs for t in trials)
    rows = [_trial_row(t, retried_by.get(t.number), fleet) for t in trials]
    if not rows:  # a study with no trial yet: the columns, no rows
        return pd.DataFrame(columns=["trial", "baseline", "status", "reason", "value",
                                     "feasible", "startup_s", "measure_s", "detail",
                                     "req_per_s", "out_tok_per_s", "failed"])
    return pd.DataFrame(rows)


def _trial_row(t: optuna.trial.FrozenTrial, retry: optuna.trial.FrozenTrial | None,
               fleet: bool) -> dict[str, Any]:
    """One trial's row of ``trials_frame``: its outcome, where its time went,
    its params and its measured figures; ``retry``: the trial that re-ran it
    when its worker was lost."""
    r = TrialRecord.from_frozen(t)
    s = r.summary or {}
    status, reason, detail = str(r.status), r.reason, r.detail
    if r.status == TrialStatus.UNKNOWN and t.state == optuna.trial.TrialState.FAIL:
        status = "worker_lost"
        reason = reason or "worker_lost"
        detail = detail or (str(retry.user_attrs.get(FleetAttr.RETRY_REASON))
                            if retry is not None else "failed without a record: its "
                            "worker stopped before writing one")
    row: dict[str, Any] = {
        "trial": r.number, "baseline": r.baseline, "status": status,
        "reason": reason, "value": r.value, "feasible": r.feasible,
        # A failure's detail is a line of the server's log: masked like
        # every text qtune writes (a token in a log line stays out).
        "startup_s": r.startup_s, "measure_s": r.measure_s,
        "detail": redact(detail) if detail else detail,
    }
    if fleet:
        row["worker"] = t.user_attrs.get(FleetAttr.WORKER)
        row["retry_of"] = t.user_attrs.get(FleetAttr.RETRY_OF)
        row["retry_reason"] = t.user_attrs.get(FleetAttr.RETRY_REASON)
        row["retried_by"] = retry.number if retry is not None else None
    row.update(_time_columns(r))
    if r.engine is not None:  # --engine a,b: the trial's engine
        row["engine"] = r.engine
    if r.load_level is not None:  # --levels: the load, and whose server
        row["load_level"], row["server_of"] = r.load_level, r.server_of
    row.update({f"param.{k}": v for k, v in r.params.items()})
    for m in ("ttft", "tpot", "itl", "e2e"):
        for p in ("p50", "p90", "p99"):
            row[f"{m}_{p}_ms"] = (s.get(f"{m}_ms") or {}).get(p)
    row["req_per_s"] = s.get("request_throughput")
    row["out_tok_per_s"] = s.get("output_token_throughput")
    row["failed"] = s.get("failed")
    # how late the measuring client's own loop ran (qtune.load.LoopLag)
    row["client_lag_max_ms"] = (s.get("client_lag_ms") or {}).get("max")
    spec = (s.get("server") or {}).get("spec_decode")
    if r.spec_of is not None or spec:  # the speculative phase (acceptance)
        row["spec_of"] = r.spec_of
        row["spec_acceptance"] = spec["acceptance_rate"] if spec else None
        row["spec_accepted_per_draft"] = (spec["mean_acceptance_length"] - 1
                                          if spec else None)
    q = Quality.from_dict(r.quality)
    if q is not None:  # the quality gate's figure (qtune.quality)
        row["quality_loss"] = q.loss
        row["quality"] = q.text()
    return row


def _time_columns(r: TrialRecord) -> dict[str, Any]:
    """Where a trial's time went: the start's phases (from the engine's log)
    and, for a capacity trial, its probes."""
    row: dict[str, Any] = {}
    ph = r.start_phases or {}
    for k in ("weights_s", "compile_s", "graphs_s", "other_s"):
        if ph.get(k) is not None:
            row[f"start.{k.removesuffix('_s')}_s"] = ph[k]
    if ph.get("cache_hit") is not None:
        row["start.compile_cached"] = ph["cache_hit"]
    cap = (r.summary or r.partial_summary or {}).get("capacity") or {}
    if cap.get("steps"):
        row["capacity.probes"] = len(cap["steps"])
        row["capacity.probes_s"] = cap.get("probes_s")
        row["capacity.saved_s"] = cap.get("saved_s")
        if cap.get("bracket"):
            row["capacity.failed_at"] = cap["bracket"][1]
    return row


def _export_trials(study: optuna.Study, path: Path) -> None:
    # qtune's own file under studies/: replaced even if read-only, but never
    # through a link or over a device (write_atomic checks).
    write_atomic(path, csv_text(trials_frame(study)), force=True,
                 what="trials table")


def _metrics_view(rec: TrialRecord | None) -> dict[str, Any] | None:
    if rec is None or rec.summary is None:
        return None
    s = rec.summary
    view: dict[str, Any] = {"trial": rec.number}
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        if s.get(m):
            view[m] = {k: round(v, 3) for k, v in s[m].items()}
    for k in ("request_throughput", "output_token_throughput"):
        view[k] = round(s[k], 4)
    view.update({k: s[k] for k in ("completed", "failed", "truncated")})
    return view


def _quality_view(rec: TrialRecord, max_loss: float) -> dict[str, Any] | None:
    """The winner's quality figure for the profile: the stored figure, the
    threshold it was held to and its one-line reading."""
    q = Quality.from_dict(rec.quality)
    if q is None:
        return None
    return {**q.to_dict(), "max_loss": max_loss, "text": q.text()}


def _as_ran(study: optuna.Study, rec: TrialRecord) -> Any:
    """A picked trial's launch as it ran (its command and env from the
    study), on the deployed port: --pick needs no engine installed."""
    from types import SimpleNamespace

    a = study.get_trials(deepcopy=False)[rec.number].user_attrs
    argv = list(a.get(Attr.ARGV) or [])
    if "--port" in argv[:-1]:
        argv[argv.index("--port") + 1] = "8000"
    return SimpleNamespace(argv=argv, env=dict(a.get(Attr.ENV) or {}))


def overload_note(baseline: TrialRecord | None, best: TrialRecord) -> str | None:
    """Which of the engine defaults' and the winner's runs fell behind the
    offered rate (``qtune.bench.falls_behind``), as the profile's notes and
    the search's summary say it; None when neither did."""
    kept = baseline is not None and best.number == baseline.number
    behind = [(label, r.summary["overloaded"]) for label, r in
              ((("engine defaults (kept)" if kept else "engine defaults"), baseline),
               ("winner", None if kept else best))
              if r is not None and r.summary and r.summary.get("overloaded")]
    if not behind:
        return None
    return overload_text("; ".join(f"the {label} {why}" for label, why in behind))


def build_profile(
    prep: Prepared,
    study: optuna.Study,
    best: TrialRecord,
    baseline: TrialRecord | None,
    n_trials: int,
    objective: Mapping[str, JSONValue],
    pareto_front: list[JSONObject] | None = None,
    engines: list[JSONObject] | None = None,
) -> Profile:
    """``objective``: best, baseline, basis and improvement, as ``finish``
    compared them (``objective_pair``).  ``engines``: each engine's best
    (``engine_summary``) in a study across engines; ``prep`` is then the
    winner's engine's."""
    cfg = prep.cfg
    # The trial ran on a random port; the deployed server gets a fixed one.
    spec = prep.engine.launch_spec(best.params, prep.ctx, host="127.0.0.1", port=8000) \
        if cfg.pick is None else _as_ran(study, best)
    quality = _quality_view(best, cfg.quality.max_loss)
    phase = study.user_attrs.get(StudyAttr.SPECULATIVE)
    notes = _profile_notes(prep, study, best, baseline, objective, engines, quality, phase)
    return Profile(
        name=prep.study_name,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        qtune_version=__version__,
        engine=EngineInfo(name=prep.ctx.install.name, version=prep.ctx.install.version,
                          build=prep.ctx.install.build),
        model=prep.ctx.model.summary(),
        params=dict(best.params),
        env=dict(spec.env),
        argv=list(spec.argv),
        metrics={
            "objective": {"name": cfg.objective, "direction": prep.direction,
                          **objective},
            "best": _metrics_view(best),
            "baseline": _metrics_view(baseline),
            "startup_s": best.startup_s,
            "confirmation": study.user_attrs.get(StudyAttr.CONFIRMATION) or None,
            "pareto_front": pareto_front,
            "quality": quality,
            "speculative": phase or None,
            # --engine a,b only: a study of one engine's profile is as it was.
            **({"engines": engines} if engines else {}),
        },
        # A --levels point is a profile for the load it was measured at.
        workload=(cfg.workload if best.load_level is None
                  else at_load(cfg.workload, best.load_level)).to_dict(),
        slo=[str(s) for s in cfg.slo],
        host=prep.host.fingerprint(),
        placement=placement(prep.host, gpus_used(prep.engine, best.params)),
        # A profile is passed around: never the storage's password.
        study=StudyRef(storage=mask_url(prep.storage_url), name=prep.study_name,
                       trial=best.number, trials_run=n_trials,
                       baseline_trial=baseline.number if baseline else None),
        notes=notes,
    )


def _profile_notes(prep: Prepared, study: optuna.Study, best: TrialRecord,
                   baseline: TrialRecord | None, objective: Mapping[str, JSONValue],
                   engines: list[JSONObject] | None, quality: dict[str, Any] | None,
                   phase: Mapping[str, Any] | None) -> list[str]:
    """What a profile's reader must know beside its figures: random weights,
    a baseline that did not run, an unmeasured quality, the speculative
    phase, the engines compared, an overload, an unconfirmed or unseparated
    winner."""
    notes = []
    if prep.ctx.model.load_format == "dummy":
        notes.append("tuned with random weights (--load-format dummy): swap in the "
                     "real checkpoint folder before serving real traffic")
    if baseline and baseline.status == TrialStatus.INVALID:
        notes.append(f"baseline (engine defaults) not launched: {baseline.detail}")
    elif baseline and baseline.status != TrialStatus.OK:
        notes.append(f"baseline (engine defaults) failed to start: {baseline.reason}: "
                     f"{baseline.detail}")
    base_note = study.trials[baseline.number].user_attrs.get(Attr.BASELINE_NOTE) \
        if baseline else None
    if base_note:
        notes.append(base_note)
    if quality is not None and not quality["measured"]:
        notes.append(f"answer quality {quality['text']}")
    if phase:
        notes.append("speculative decoding: " + summary_line(phase))
    if engines:
        notes.append(f"searched across engines ({', '.join(str(r['engine']) for r in engines)})"
                     f"; the improvement is over {prep.engine.name}'s own defaults; each "
                     "engine's best: " + "; ".join(summary_lines(engines)))
    if (over := overload_note(baseline, best)) is not None:
        notes.append(over)
    conf = (study.user_attrs.get(StudyAttr.CONFIRMATION) or {}).get(str(best.number)) or {}
    if conf.get("failures"):
        runs = len(conf.get("fresh") or []) + int(conf["failures"])
        notes.append(f"NOT CONFIRMED: the winner failed {conf['failures']} of its {runs} fresh "
                     "start(s) in the confirmation (no other config held cleanly); qtune "
                     "verify measures it again")
    if objective.get("separated") is False:
        notes.append("the winner's confirmation runs overlap the engine defaults': the "
                     "improvement is within this host's run-to-run noise; qtune verify "
                     "--repeat 5 measures it with more starts")
    return notes


def summary_line(record: Mapping[str, JSONValue]) -> str:
    """The speculative-decoding phase's outcome (``qtune.search.
    speculative``, the study's ``speculative`` attribute) in one line: the
    profile's note, ``qtune report`` and the HTML report."""
    # Read as speculative_phase wrote it (its candidates, the A/B's figures).
    rec: Mapping[str, Any] = record
    if not rec.get("searched"):
        return str(rec.get("why"))
    parts = []
    for c in rec.get("candidates") or []:
        sd = c.get("spec_decode")
        acc = f"acceptance {sd['acceptance_rate']:.0%}" if sd else "no drafts"
        parts.append(f"trial {c['trial']} ({c['config']}): {acc}")
    head = "; ".join(parts)
    if rec.get("gain") is None:
        return f"{head}; {rec.get('why')}"
    ci = rec.get("gain_ci95")
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    verdict = (f"kept trial {rec['kept']}" if rec.get("kept") is not None
               else "not kept")
    return (f"{head}; trial {rec['compared']} against base trial {rec['base_trial']} in "
            f"{rec['repeats']} interleaved rounds: {rec['gain']:.2f}x{interval}, "
            f"{verdict} ({rec['why']})")
