"""``qtune report``: what a study found, as a table, CSV/Parquet and a
self-contained HTML page (inline SVG, no scripts, no network): the
optimisation history, throughput against tail latency, parameter
importances and the trial log.
"""

from __future__ import annotations

import html
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from qtune.errors import InputError, StudyError, mask_url, printable
from qtune.files import check_target, csv_text, write_atomic
from qtune.objectives import get_objective
from qtune.plots import history_svg, importance_svg, rows, tick_text, tradeoff_svg, trial_why
from qtune.recommendation import Recommendation, recommend, unit_of
from qtune.search.choice import engine_summary, summary_lines
from qtune.search.config import check_study_name
from qtune.search.records import Attr, StudyAttr, TrialStatus, maximizes, ran_trials
from qtune.search.result import summary_line, trials_frame, winner
from qtune.search.storage import check_storage_url, open_storage

if TYPE_CHECKING:
    import pandas as pd


def load_study(name: str, storage: str | None, studies_dir: Path = Path("studies")
               ) -> tuple[optuna.Study, str]:
    """Open an existing study read-only: a report creates no folder, file or
    database, whatever the name or URL.  ``name`` is a study name, or the
    path of a journal file (``studies/x.log``, a copied run's journal):
    then the study in it (the one named like the file when it holds
    several)."""
    if storage is None and _is_path(name):
        return _load_journal(Path(name))
    check_study_name(name, "study")
    journal = (studies_dir / (name + ".log")).absolute()
    url = storage or f"journal://{journal}"
    if storage is None and not journal.is_file():
        known = sorted(p.stem for p in studies_dir.glob("*.log")) \
            if studies_dir.is_dir() else []
        raise StudyError(f"no study {name!r} under {studies_dir}/",
                         hint=("studies here: " + ", ".join(known[:20])) if known
                         else "run qtune search first, or pass --storage URL, or "
                         "a journal file's path")
    if storage is not None:
        check_storage_url(storage)
    opened = open_storage(url, read_only=True)
    try:
        study = optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        names = _study_names(opened)
        raise StudyError(f"no study {name!r} in {mask_url(url)}",
                         hint=("studies there: " + ", ".join(names[:20])) if names
                         else "the storage holds no study: check --storage") from None
    return study, url


def _is_path(name: str) -> bool:
    # A study name has no '/' and no ".log" ending (check_study_name); a
    # journal file is named by its path.
    return "/" in name or name.endswith(".log")


def _study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return sorted(s.study_name for s in storage.get_all_studies())


def _load_journal(path: Path) -> tuple[optuna.Study, str]:
    if not path.is_file():
        shown = printable(str(path))[:200]
        raise StudyError(f"{shown!r}: not a study name, and no journal file there",
                         hint="give a study name (studies/<name>.log) or the path of "
                         "an existing journal file")
    url = f"journal://{path.absolute()}"
    check_storage_url(url)  # a torn last record: refused with its repair
    opened = open_storage(url, read_only=True)
    names = _study_names(opened)
    if not names:
        raise StudyError(f"{path}: no study in this journal",
                         hint="is it an Optuna journal written by qtune search?")
    name = path.stem if path.stem in names or len(names) > 1 else names[0]
    if name not in names:
        raise StudyError(f"{path} holds several studies, none named {path.stem!r}",
                         hint=f"qtune report NAME --storage {url} with NAME one of "
                         + ", ".join(names[:20]))
    return optuna.load_study(study_name=name, storage=opened), url


def importances(study: optuna.Study) -> dict[str, float]:
    # --levels points repeat their launch's params at another load: they
    # would credit the load's effect to the parameters.
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE
            and t.params and Attr.SERVER_OF not in t.user_attrs]
    if len(done) < 3:
        return {}
    # The baseline trial has no parameters, which would empty the common
    # search space: compute on a scratch study of the tuned trials only.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    multi = len(study.directions) > 1
    scratch = optuna.create_study(directions=study.directions)
    scratch.add_trials(done)
    try:
        with warnings.catch_warnings():  # "low target is better": it is (a latency)
            warnings.simplefilter("ignore", UserWarning)
            return {k: float(v) for k, v in optuna.importance.get_param_importances(
                # pareto: the importance for the latency (the second value)
                scratch, target=(lambda t: t.values[1]) if multi else None).items()}
    except (ValueError, RuntimeError, ZeroDivisionError, TypeError):
        return {}


def probes(study: optuna.Study) -> dict[int, list[dict[str, Any]]]:
    """Each capacity trial's probes (load, held or not, why), in order."""
    out = {}
    for t in ran_trials(study):
        a = t.user_attrs
        cap = ((a.get(Attr.SUMMARY) or a.get(Attr.PARTIAL_SUMMARY) or {})
               .get("capacity") or {})
        steps = [s for s in cap.get("steps") or [] if isinstance(s, dict)
                 and isinstance(s.get("load"), (int, float))]
        if steps:
            out[t.number] = steps
    return out


def _quality_html(study: optuna.Study, df: pd.DataFrame) -> str:
    """The quality gate's section: each launched trial's figure against the
    engine defaults (qtune.quality), and the threshold."""
    if "quality" not in df:
        return ""
    limit = study.user_attrs.get(StudyAttr.MAX_QUALITY_LOSS)
    rows = "".join(
        f"<li>trial {r.trial}: {html.escape(str(r.quality))}"
        + (" <b>(refused: over the threshold)</b>" if r.reason == "quality_loss" else "")
        + "</li>"
        for r in df.itertuples() if isinstance(r.quality, str))
    head = ("<p>perplexity of qtune's evaluation text and greedy exact match against "
            "the engine defaults" + (f"; max loss {limit * 100:g}%" if limit is not None
                                     else "") + "</p>")
    return f"<h2>Answer quality</h2>{head}<ul>{rows}</ul>"


def _speculative_html(study: optuna.Study) -> str:
    """The speculative-decoding phase (qtune.search.speculative): its
    candidates' acceptance and the A/B against the base config."""
    rec = study.user_attrs.get(StudyAttr.SPECULATIVE)
    if not rec:
        return ""
    return f"<h2>Speculative decoding</h2><p>{html.escape(summary_line(rec))}</p>"


def _engines_html(study: optuna.Study) -> str:
    """``--engine a,b``: each engine's best against the others'."""
    rows = engine_summary(study)
    if not rows:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(rows))
    return ("<h2>Engines</h2><p>each engine's best feasible trial on this workload "
            f"(value: the objective)</p><ul>{items}</ul>")


def _cell(v: Any) -> str:
    """A table cell a person reads: yes/blank for flags, round numbers
    (no 7.126e-07), blank for a gap."""
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, float):
        if v == 0 or v.is_integer() and abs(v) < 1e15:
            return f"{v:,.0f}" if abs(v) >= 10000 else f"{v:.0f}"
        if abs(v) < 0.001:
            return "<0.001" if v > 0 else ">-0.001"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return html.escape(str(v))


# The measured columns shown after the params, in this order, then the rest.
_LEADING = ("value", "ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms", "req_per_s",
            "out_tok_per_s", "failed")


def trials_table_html(df: pd.DataFrame, best: int | None) -> str:
    """The trials: the config (params) first, then the objective and the
    key figures, then the rest; the recommended row highlighted.  In a
    horizontally scrollable box: a study has 30+ columns."""
    if df.empty:
        return "<p>No trial ran.</p>"
    params = [c for c in df.columns if c.startswith("param.")]
    lead = ["trial", "status", "reason", *params, *[c for c in _LEADING if c in df]]
    rest = [c for c in df.columns if c not in lead and c not in ("detail", "baseline")]
    cols = [*lead, *rest]
    # Two header rows: what each group of columns is, then the columns.
    measured = len(cols) - 3 - len(params)
    groups = "".join(f'<th colspan="{n}" class="group">{label}</th>'
                     for label, n in (("trial", 3), ("config: launch parameters", len(params)),
                                      ("measured", measured)) if n)
    head = "".join(f"<th>{html.escape(c.removeprefix('param.'))}</th>" for c in cols)
    body = []
    for r in rows(df):
        cls = ' class="winner"' if r.trial == best else (
            ' class="defaults"' if r.baseline is True else
            "" if r.status == TrialStatus.OK else ' class="dim"')
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "trial":
                tag = " &#9733; recommended" if r.trial == best else (
                    " (defaults)" if r.baseline is True else "")
                cells.append(f"<td>{v}{tag}</td>")
            elif c == "reason" and (r.reason is None or r.reason == r.status):
                cells.append("<td></td>")
            else:
                cells.append(f"<td>{_cell(v)}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="trials"><thead><tr>{groups}</tr>'
            f'<tr class="names">{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def recommendation_html(rec: Recommendation) -> str:
    """The page's first section: what to run, by how much it beat the
    defaults, on what, the quality verdict and the command to deploy it."""
    f = rec.figure
    items = []
    if rec.trial is None:
        return ('<section class="answer"><h2>Recommendation</h2>'
                f"<p>{html.escape(rec.headline)}</p></section>")
    if rec.kept_defaults:
        why = "no config beat them" if rec.rivals else "no other config was measured"
        items.append(f"<li><b>Config</b>: the engine defaults ({why})</li>")
    else:
        flags = " ".join(rec.flags) or ", ".join(f"{k}={v}" for k, v in rec.params.items())
        items.append(f"<li><b>Config</b> (trial {rec.trial}): <code>{html.escape(flags)}"
                     "</code></li>")
    if f is not None:
        gain = f"<b>{f.ratio:.2f}x</b>" if f.ratio is not None else "no ratio"
        interval = ""
        if f.interval is not None:
            hi = "∞" if f.interval[1] is None else f"{f.interval[1]:.2f}"
            interval = f", interval [{f.interval[0]:.2f}, {hi}]"
        conf = ("confirmed on fresh starts" if f.confirmed
                else f"<b>not confirmed</b>: {html.escape(f.why_not_confirmed or '')}")
        items.append(
            f"<li><b>{html.escape(f.metric)}</b>: {_fig(f.best, f.unit)} against the "
            f"engine defaults' {_fig(f.baseline, f.unit)}: {gain}{interval} "
            f"({html.escape(f.basis)}); {conf}</li>")
        if f.bracket is not None:
            top = "not found (nothing above it failed)" if f.bracket[1] is None \
                else f"{f.bracket[1]:g}"
            how = f"; {html.escape(f.decided)}" if f.decided else ""
            items.append(f"<li><b>Capacity bracket</b>: held {f.bracket[0]:g} {f.unit}, "
                         f"failed at {top}{how}</li>")
        if f.from_verdicts is not None:
            items.append("<li><b>Capacity from every window's verdict</b>: "
                         f"{html.escape(f.from_verdicts.text(f.unit))}</li>")
    if rec.slo:
        basis = f" ({html.escape(rec.slo_basis)})" if rec.slo_basis else ""
        items.append(f"<li><b>SLO</b>{basis}: {html.escape('; '.join(rec.slo))}</li>")
    on = rec.measured_on
    items.append(f"<li><b>Measured on</b>: {html.escape(on['accelerator'])}, "
                 f"{html.escape(on['engine'])}, model {html.escape(on['model'])}; "
                 f"workload: {html.escape(on['workload'])}</li>")
    if on.get("ran"):
        items.append(f"<li><b>Ran</b>: {html.escape(on['ran'])}</li>")
    items.append(f"<li><b>Answer quality</b>: {html.escape(rec.quality)}</li>")
    if rec.emit_command:
        why = f" ({html.escape(rec.emit_why)})" if rec.emit_why else ""
        items.append(f"<li><b>Deploy</b>: <code>{html.escape(rec.emit_command)}</code>{why}</li>")
    return (f'<section class="answer"><h2>Recommendation</h2>'
            f"<p>{html.escape(rec.headline)}</p><ul>{''.join(items)}</ul></section>")


def _history_metric(objective: str) -> str:
    """What a trial's value is: a Pareto study's value is its latency."""
    try:
        obj = get_objective(objective)
    except InputError:  # a study of a qtune that knew other objectives
        return objective
    return obj.run_metric if obj.is_pareto else objective


def _fig(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{tick_text(v)} {html.escape(unit)}"


def render_html(study: optuna.Study, url: str, df: pd.DataFrame, imp: dict[str, float],
                rec: Recommendation | None = None) -> str:
    objective = study.user_attrs.get(StudyAttr.OBJECTIVE, "value")
    maximize = maximizes(study)
    rec = rec or recommend(study)
    shown_url = html.escape(mask_url(url))
    wl = study.user_attrs.get(StudyAttr.WORKLOAD, {})
    unit = unit_of(objective, wl) if objective != "value" else ""
    best = rec.trial
    fails = df[~df["status"].isin([TrialStatus.OK])] if not df.empty else df
    quality = _quality_html(study, df)
    fail_rows = "".join(f"<li>{html.escape(trial_why(r, None))}</li>" for r in rows(fails))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>qtune report: {html.escape(study.study_name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
.scroll{{overflow-x:auto;max-width:100%;border:1px solid #ddd}}
table.trials{{border-collapse:collapse;font-size:12px;white-space:nowrap}}
table.trials td,table.trials th{{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}}
table.trials th{{position:sticky;top:0;background:#fafafa}}
table.trials th.group{{text-align:left;border-left:2px solid #bbb}}
table.trials tr.names th{{top:1.5em}}
tr.winner{{background:#dff5df;font-weight:bold}} tr.defaults{{background:#f2f2f2}}
tr.dim{{color:#888}} .answer{{border:2px solid #2ca02c;padding:0 1em;border-radius:6px}}
.grid{{display:flex;flex-wrap:wrap;gap:1em}} code{{background:#f4f4f4}}
.tick{{font-size:10px;fill:#444}} .label{{font-size:9px;fill:#333}}
.legend{{font-size:12px;margin:0}}</style></head>
<body><h1>qtune study <code>{html.escape(study.study_name)}</code></h1>
{recommendation_html(rec)}
<p>objective <b>{html.escape(objective)}</b> ({"max" if maximize else "min"}imise);
storage <code>{shown_url}</code></p>
<h2>Trials</h2>{trials_table_html(df, best)}
<h2>Plots</h2>
<div class="grid"><div>{history_svg(df, _history_metric(objective), maximize, unit, best)}</div>
<div>{tradeoff_svg(df, objective, best, unit, probes(study))}</div></div>
{importance_svg(imp)}
{_engines_html(study)}{quality}{_speculative_html(study)}
<h2>Failures, pruned and skipped trials</h2><ul>{fail_rows or "<li>none</li>"}</ul>
</body></html>
"""


def report(name: str, storage: str | None, *, csv: Path | None = None,
           parquet: Path | None = None, html_path: Path | None = None,
           force: bool = False) -> dict[str, Any]:
    # Every target is checked before the study is read (and each again as
    # it is written): a folder or device named by --html fails at once.
    targets = {"--csv": csv, "--parquet": parquet, "--html": html_path}
    for flag, path in targets.items():
        if path is not None:
            check_target(path, flag, force=force)
    named = [p.absolute() for p in targets.values() if p is not None]
    if len(set(named)) < len(named):
        raise StudyError("--csv, --parquet and --html name the same file",
                         hint="give each export its own file")
    if parquet:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise StudyError("--parquet needs pyarrow",
                             hint="pip install pyarrow, or use --csv") from None
    study, url = load_study(name, storage)
    df = trials_frame(study)
    imp = importances(study)
    if csv:
        write_atomic(csv, csv_text(df), force=force, what="--csv")  # formula-safe cells
    if parquet:
        import io

        buf = io.BytesIO()  # through write_atomic, not pandas' own open()
        df.to_parquet(buf, index=False)
        write_atomic(parquet, buf.getvalue(), force=force, what="--parquet")
    rec = recommend(study)
    if html_path:
        write_atomic(html_path, render_html(study, url, df, imp, rec), force=force,
                     what="--html")
    # The trial the search writes as the profile: the same rule, the same answer.
    won = winner(study)
    best = won.number if won is not None else None
    # Counts are of launches; --levels points are counted apart.
    launches = df[df["server_of"].isna()] if "server_of" in df else df
    counts = launches["status"].value_counts().to_dict()
    if len(launches) < len(df):
        counts["level_points"] = len(df) - len(launches)
    engines = engine_summary(study)
    return {"study": study.study_name, "storage": mask_url(url),
            "objective": study.user_attrs.get(StudyAttr.OBJECTIVE),
            # The answer first: what to run, by how much, on what.
            "recommendation": rec.to_dict(),
            "trials": df.to_dict(orient="records"), "best_trial": best,
            "importances": imp, "counts": counts,
            **({"engines": engines} if engines else {}),
            **({"speculative": _speculative_line(study)}
               if study.user_attrs.get(StudyAttr.SPECULATIVE) else {})}


def _speculative_line(study: optuna.Study) -> str:
    return summary_line(study.user_attrs[StudyAttr.SPECULATIVE])
