"""What a study recommends, in the words a report leads with: the winning
config's flags, its figure against the engine defaults (units, ratio and
the confirmation's interval, or why it is not confirmed), what it was
measured on, the answer-quality verdict and the command that deploys it.

One typed ``Recommendation`` for the text report, the HTML page and
``report --json`` (``recommendation``): the three say the same thing.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import optuna

from qtune.emit.systemd import flags_needed
from qtune.errors import InputError, QtuneError
from qtune.objectives import Objective, get_objective, parse_slo
from qtune.profile import Profile
from qtune.quality import Quality
from qtune.search.gain import (
    ObjectivePair,
    chance_apart,
    gain_interval,
    objective_pair,
    one_run_a_side,
    overlap_why,
)
from qtune.search.records import (
    StudyAttr,
    TrialRecord,
    TrialStatus,
    maximizes,
    ran_trials,
)
from qtune.search.result import baseline_for, winner
from qtune.stats import VerdictCapacity


@dataclasses.dataclass(frozen=True)
class Figure:
    """The winner's objective against the engine defaults'."""

    metric: str  # the objective's metric (a Pareto point: its latency)
    unit: str
    best: float | None
    baseline: float | None
    ratio: float | None  # > 1: better than the defaults, in the objective's sense
    basis: str  # "median of the confirmation runs" or "one run each"
    interval: tuple[float, float | None] | None  # the ratio's, from the confirmation
    confirmed: bool
    why_not_confirmed: str | None
    # A capacity: the winner's bracket [held, failed) from its probes
    # (failed None: nothing above it was tried, or failed).
    bracket: tuple[float, float | None] | None = None
    decided: str | None = None  # how the capacity search settled on it
    # A capacity read from every window's verdict (the search's and the
    # confirmation's fresh starts'), with its 90% interval.
    from_verdicts: VerdictCapacity | None = None


@dataclasses.dataclass(frozen=True)
class Recommendation:
    study: str
    objective: str
    trial: int | None  # None: no feasible trial, nothing to recommend
    kept_defaults: bool  # the engine defaults won: nothing to change
    flags: list[str]  # the tuned flags as the engine takes them
    params: dict[str, Any]
    figure: Figure | None
    measured_on: dict[str, str]  # accelerator, ran, engine, model, workload
    quality: str
    emit_command: str | None
    headline: str  # one sentence: what to run and by how much it beat the defaults
    # Each SLO in the winner's run: its value against its limit, the closest
    # to its limit first (what stopped a capacity there).
    slo: list[str] = dataclasses.field(default_factory=list)
    slo_basis: str = ""  # which run the SLO line reads
    rivals: int = 0  # other configs measured beside the winner
    emit_why: str | None = None  # why the deploy command carries its flags

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unit_of(objective: str, workload: dict[str, Any]) -> str:
    """The objective's unit: ms for a latency, req/s or tok/s for a rate,
    streams or req/s for a capacity (as the workload offers its load)."""
    try:
        obj = get_objective(objective)
    except InputError:  # a study of a qtune that knew other objectives
        return ""
    if obj.direction in ("minimize", "pareto"):
        return "ms"
    if obj.name == "capacity":
        return "req/s" if workload.get("rate") is not None else "streams"
    return "tok/s" if obj.name == "output_throughput" else "req/s"


def workload_text(wl: dict[str, Any]) -> str:
    """A study's workload as a person reads it (not a Python dict)."""
    if not wl:
        return "not recorded"
    if wl.get("rate") is not None:
        load = f"{wl['rate']:g} req/s ({wl.get('arrival') or 'poisson'} arrivals)"
    elif wl.get("concurrency") is not None:
        load = f"{wl['concurrency']} concurrent streams"
    else:
        load = "the default load"
    parts = [load]
    if wl.get("dataset"):
        parts.append(f"prompts from {wl['dataset']}")
    else:
        parts.append(f"prompts of {wl.get('input_len')} tokens")
    parts.append(f"outputs of {wl.get('output_len')} tokens")
    if wl.get("prefix_count"):
        parts.append(f"{wl['prefix_count']} shared prefixes of {wl.get('prefix_len')} tokens")
    if wl.get("requests") is not None:
        parts.append(f"{wl['requests']} measured requests")
    if wl.get("duration") is not None:
        parts.append(f"{wl['duration']:g} s per run")
    if wl.get("warmup_requests"):
        parts.append(f"{wl['warmup_requests']} warm-up")
    if wl.get("endpoint") and wl["endpoint"] != "completions":
        parts.append(f"the {wl['endpoint']} endpoint")
    return ", ".join(parts)


def launch_flags(rec: TrialRecord) -> list[str]:
    """The winner's tuned settings as its launch passed them: each flag with
    its value from the trial's command, and environment variables as
    NAME=value.  A parameter the command does not carry (an engine default
    chosen) is left out: nothing to pass."""
    argv, out = rec.argv, []
    names = [k.replace("_", "-") for k in rec.params]
    # a boolean off is often its --no- form (vLLM's --no-enable-prefix-caching)
    wanted = {f"--{n}" for n in names} | {f"--no-{n}" for n in names}
    i = 0
    while i < len(argv):
        tok = argv[i]
        flag = tok.split("=", 1)[0]
        # Only the trial's params: the flags every launch has (where and what
        # it serves) are the adapter's, and never params.
        if flag.startswith("--") and flag in wanted:
            has_value = "=" not in tok and i + 1 < len(argv) \
                and not argv[i + 1].startswith("--")
            out.append(f"{tok} {shlex.quote(argv[i + 1])}" if has_value else tok)
            i += 2 if has_value else 1
            continue
        i += 1
    out += [f"{k}={shlex.quote(str(v))}" for k, v in sorted(rec.env.items())
            if k in rec.params]
    return out


def ran_text(study: optuna.Study) -> str:
    """When the trials ran, for how long, and what became of them: "trials
    ran 2026-12-03 17:55-18:08 (12.8 min): 1 ok, 3 pruned" (the host's
    clock, as Optuna records it; the confirmation's runs are not trials)."""
    spans = [(t.datetime_start, t.datetime_complete or t.datetime_start)
             for t in study.get_trials(deepcopy=False) if t.datetime_start]
    if not spans:
        return "no trial ran"
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    counts = Counter(str(TrialRecord.from_frozen(t).status) for t in ran_trials(study))
    span = f"{start:%Y-%m-%d %H:%M}-{end:%H:%M}" if start.date() == end.date() \
        else f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}"
    what = ", ".join(f"{n} {status}" for status, n in
                     sorted(counts.items(), key=lambda kv: (kv[0] != "ok", -kv[1])))
    return f"trials ran {span} ({(end - start).total_seconds() / 60:.1f} min)" + \
        (f": {what}" if what else "")


def _measured_on(study: optuna.Study, best: TrialRecord | None) -> dict[str, str]:
    facts = study.user_attrs.get("fleet_host_facts") or {}
    install = study.user_attrs.get(StudyAttr.ENGINE_INSTALL) or {}
    model = study.user_attrs.get(StudyAttr.MODEL) or {}
    engine = facts.get("engine") or (
        f"{install['name']} {install.get('version', '?')} ({install.get('build', '?')})"
        if install.get("name") else "engine not recorded (a study of an older qtune)")
    if best is not None and best.engine and best.engine not in engine:
        engine = f"{best.engine} (searched across engines)"
    weights = " with random weights" if model.get("load_format") == "dummy" else ""
    return {
        "accelerator": facts.get("accelerator") or "accelerator not recorded",
        "ran": ran_text(study),
        "engine": engine,
        "model": f"{model.get('id', '?')}{weights}",
        "workload": (("load searched (capacity), first offered as "
                      if study.user_attrs.get(StudyAttr.OBJECTIVE) == "capacity" else "")
                     + workload_text(study.user_attrs.get(StudyAttr.WORKLOAD) or {})),
    }


def quality_verdict(study: optuna.Study, best: TrialRecord | None) -> str:
    """Can the winner's answers be trusted as the model's?  Random weights
    measure speed only; a config that changes the numerics (fp8) needs its
    quality measured (qtune.quality), else it says so, as every emitted
    file does (emit's quality warnings)."""
    model = study.user_attrs.get(StudyAttr.MODEL) or {}
    q = Quality.from_dict(best.quality) if best is not None else None
    lossy = q is not None and bool(q.numerics) and not q.measured
    if model.get("load_format") == "dummy":
        head = ("random weights (--load-format dummy): the speed is measured, answer "
                "quality is not; swap in the real checkpoint before serving")
        if lossy:
            assert q is not None  # lossy says so
            what = ", ".join(f"{k}={v}" for k, v in sorted(q.numerics.items()))
            return head + f"; this config changes the model's numerics ({what}): NOT measured"
        return head
    if q is not None and q.measured:
        limit = study.user_attrs.get(StudyAttr.MAX_QUALITY_LOSS)
        return f"measured against the engine defaults: {q.text()}" + (
            f" (limit +{limit * 100:g}%)" if limit is not None else "")
    if q is not None:
        return q.text()
    notes = " ".join(study.user_attrs.get(StudyAttr.SPACE_NOTES) or [])
    if "left out" in notes and "fp8" in notes:
        return "lossless: fp8 weights and KV cache were left out of the space, the " \
            "model's numerics are kept"
    return "not recorded"


def slo_headroom(summary: dict[str, Any] | None) -> list[str]:
    """Each SLO check of a run (``summary["goodput"]["checks"]``) as "metric
    value unit, share of its limit", the one closest to its limit first and
    named so: on one H200 the defaults' capacity of 26.4 req/s stopped at
    TPOT p99 19.4 ms against 20 (97%) while TTFT used 43% of its limit."""
    checks = ((summary or {}).get("goodput") or {}).get("checks") or {}
    rows = []
    for key, check in checks.items():
        try:
            (slo,) = parse_slo(str(key))
        except (InputError, ValueError):  # a study of a qtune that wrote others
            continue
        v = check.get("value") if isinstance(check, dict) else None
        unit = "ms" if slo.metric != "throughput" else "req/s"
        if not isinstance(v, (int, float)) or not math.isfinite(v) or slo.limit <= 0 \
                or (slo.op == ">=" and v <= 0):
            # no figure: a broken SLO (first in the list), never "nan%"
            rows.append((float("inf"), f"{slo.metric}: no value against {slo.op} "
                         f"{slo.limit:g} {unit} (broken)"))
            continue
        share = v / slo.limit if slo.op == "<=" else slo.limit / v
        rows.append((share, f"{slo.metric} {v:,.4g} {unit} against {slo.op} {slo.limit:g} "
                     f"{unit} ({share:.0%} of the limit{'' if check.get('met') else ', broken'})"))
    rows.sort(key=lambda r: -r[0])
    out = [text for _, text in rows]
    if len(out) > 1:
        out[0] += ", the closest"
    return out


def _not_confirmed_why(study: optuna.Study, best: TrialRecord, baseline: TrialRecord | None,
                       pair: ObjectivePair) -> str | None:
    conf = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    mine = conf.get(str(best.number)) or {}
    if baseline is None:
        return "the engine defaults were not measured"
    if not conf:
        return ("no confirmation was run (--confirm-top 0, a time budget spent, or a "
                "study stopped before it); qtune verify measures it with fresh starts")
    if str(best.number) not in conf:
        return "the winner was not among the re-measured configs"
    if mine.get("failures"):
        return f"the winner failed {mine['failures']} of its fresh starts"
    if baseline.number != best.number and str(baseline.number) not in conf:
        return ("the engine defaults were not re-measured beside it (they were not "
                "feasible in the search)")
    if pair.get("separated") is False:
        return overlap_why(study, best, baseline)
    return None


def _emit_command(study: optuna.Study) -> tuple[str, str | None]:
    """The command that deploys the winner, and why it carries the flags it
    does (None when it needs none)."""
    # The search writes profiles/<study>.yaml unless --out named another path,
    # which it records (a transformers study on the GPU, run 20, wrote --out
    # /tmp/qt/h200-tf.yaml and its report said profiles/h200-tf.yaml).
    path = study.user_attrs.get(StudyAttr.PROFILE)
    if not isinstance(path, str) or not path:
        path = f"profiles/{study.study_name}.yaml"
    command = f"qtune emit {shlex.quote(path)} --format systemd"
    # The flags this host's paths need, so that the line runs as pasted (the
    # quick start's bare command was refused: its clone under /tmp, its
    # venv's python linking under /root); why on a line of its own.
    if os.path.isfile(path):
        try:
            flags, why = flags_needed(Profile.load(Path(path)))
        except QtuneError:
            return command, None
        if flags:
            return (f"{command} {' '.join(shlex.quote(f) for f in flags)}",
                    "on this host: " + "; ".join(why))
    return command, None


def recommend(study: optuna.Study) -> Recommendation:
    objective = study.user_attrs.get(StudyAttr.OBJECTIVE) or "e2e_p99"
    try:
        obj = get_objective(objective)
    except InputError:  # a study of a qtune that knew other objectives
        obj = Objective(objective, "maximize" if maximizes(study) else "minimize", objective)
    workload = study.user_attrs.get(StudyAttr.WORKLOAD) or {}
    best = winner(study)
    measured_on = _measured_on(study, best)
    quality = quality_verdict(study, best)
    if best is None:
        return Recommendation(study.study_name, objective, None, False, [], {}, None,
                              measured_on, quality, None,
                              "no feasible trial: nothing to recommend (see the "
                              "trials below for why each failed)")
    trials = [TrialRecord.from_frozen(t) for t in ran_trials(study)]
    baseline = baseline_for(trials, best)
    kept = baseline is not None and best.number == baseline.number
    pair = objective_pair(study, best, baseline)
    b, w = pair.get("baseline"), pair.get("best")
    ratio = None
    if isinstance(b, (int, float)) and isinstance(w, (int, float)) and min(b, w) > 0:
        ratio = w / b if obj.direction == "maximize" else b / w
    interval: tuple[float, float | None] | None = None
    if (ratios := pair.get("interval")) is not None:  # a capacity's bracket ratio
        lo, hi = ratios
        interval = (float(lo or 0.0), None if hi is None else float(hi))
    elif baseline is not None:
        interval = gain_interval(study, best, baseline, obj.direction == "maximize")
    basis = str(pair.get("basis", "one run each"))
    if interval is None and baseline is not None and one_run_a_side(study, best, baseline):
        basis += ": one fresh run each, too few for an interval (--confirm-repeats 3)"
    elif baseline is not None and pair.get("separated") and \
            (apart := chance_apart(study, best, baseline)) is not None:
        n, m, p = apart
        basis += (f"; {n} and {m} fresh runs: runs this far apart happen by chance 1 "
                  f"time in {round(1 / p)} (--confirm-repeats 3: 1 in 20)")
    why = _not_confirmed_why(study, best, baseline, pair)
    unit = unit_of(objective, workload)
    cap = (best.summary or {}).get("capacity") or {}
    # A capacity confirmed on fresh starts: its bracket and verdict are the
    # confirmation's (a winner may have held one rung below its search's).
    conf = (study.user_attrs.get(StudyAttr.CONFIRMATION) or {}).get(str(best.number)) or {}
    found = conf.get("bracket") or cap.get("bracket")
    bracket = None
    if isinstance(found, list) and found and found[0] is not None:
        held, failed = found[0], found[1]
        bracket = (float(held), None if failed is None else float(failed))
    runs = [str(r) for r in conf.get("runs") or [] if r]
    decided = "; on its fresh start" + ("s" if len(runs) > 1 else "") + ": " + \
        " / ".join(runs) if runs else ""
    figure = Figure(obj.run_metric if obj.name != "capacity" else "capacity", unit,
                    w, b, ratio, basis, interval,
                    why is None, why, bracket,
                    (str(cap["decided"]) + decided) if cap.get("decided") else None,
                    VerdictCapacity.from_dict(conf.get("from_verdicts"))
                    or VerdictCapacity.from_dict(cap.get("from_verdicts")))
    flags = launch_flags(best)
    slo_basis, slo_lines = _slo_lines(best, cap, conf, bracket, unit)
    # One sentence: the config's flags, the confirmation's why, the
    # quality and the deploy command have their own lines.
    confirmed = "confirmed on fresh starts" if why is None else "NOT confirmed"
    # A study that launched nothing but the defaults (a time budget that
    # kept the rest for the confirmation: GPU run 21) compared nothing; its
    # report said "no config beat them".
    rivals = sum(1 for t in trials if t.number != best.number and (
        t.status in (TrialStatus.OK, TrialStatus.LOAD_FAILED, TrialStatus.PRUNED)
        or (t.status == TrialStatus.UNKNOWN and t.value is not None)))
    if kept and not rivals:
        head = (f"keep the engine defaults: no other config was measured, so nothing "
                f"was compared ({value_text(w, unit)} on {figure.metric}; {confirmed}); "
                "give the search more --trials or --time-budget")
    elif kept:
        head = (f"keep the engine defaults: no config beat them "
                f"({value_text(w, unit)} on {figure.metric}; {confirmed})")
    else:
        gain = f"{ratio:.2f}x" if ratio is not None else "an unmeasured gain"
        head = (f"run trial {best.number}: {value_text(w, unit)} on {figure.metric} against "
                f"the engine defaults' {value_text(b, unit)}, {gain}; {confirmed}")
    command, command_why = _emit_command(study)
    return Recommendation(study.study_name, objective, best.number, kept, flags,
                          dict(best.params), figure, measured_on, quality,
                          command, head, slo_lines, slo_basis, rivals,
                          command_why)


def _slo_lines(best: TrialRecord, cap: dict[str, Any], conf: dict[str, Any],
               bracket: tuple[float, float | None] | None,
               unit: str) -> tuple[str, list[str]]:
    """The SLO line's basis and checks: for a capacity, the fresh start's run
    at the load the profile plans with when the confirmation held it
    (``at_held``), else the winner's search run, said to be above that load
    when the confirmation moved it down."""
    at_held = conf.get("at_held")
    if isinstance(at_held, dict) and isinstance(at_held.get("checks"), dict) \
            and isinstance(at_held.get("load"), (int, float)):
        return (f"its fresh start at {value_text(at_held['load'], unit)}",
                slo_headroom({"goodput": {"checks": at_held["checks"]}}))
    lines = slo_headroom(best.summary)
    if not isinstance(cap.get("value"), (int, float)):
        return "its search run", lines
    basis = f"its search run at {value_text(cap['value'], unit)}"
    if bracket is not None and bracket[0] < float(cap["value"]):
        basis += f", above the {value_text(bracket[0], unit)} the profile plans with"
    return basis, lines


def value_text(v: Any, unit: str) -> str:
    """A figure as the first screen says it: four significant digits (a
    capacity of 2.375 req/s is not "2.4"), grouped thousands."""
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v:,.4g} {unit}" if abs(v) < 1e4 else f"{v:,.0f} {unit}"
