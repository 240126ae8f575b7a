"""``qtune report``: what a study found, as a table, CSV/Parquet and a
self-contained HTML page (inline SVG, no scripts, no network): the
optimisation history, throughput against tail latency, parameter
importances and the trial log.
"""

from __future__ import annotations

import html
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from qtune.errors import StudyError, mask_url
from qtune.files import check_target, csv_text, write_atomic
from qtune.search.choice import engine_summary, summary_lines
from qtune.search.config import check_study_name
from qtune.search.records import Attr, StudyAttr, TrialStatus, maximizes
from qtune.search.result import summary_line, trials_frame, winner
from qtune.search.storage import check_storage_url, open_storage


def load_study(name: str, storage: str | None, studies_dir: Path = Path("studies")
               ) -> tuple[optuna.Study, str]:
    """Open an existing study read-only: a report creates no folder, file or
    database, whatever the name or URL."""
    check_study_name(name, "study")
    journal = (studies_dir / (name + ".log")).absolute()
    url = storage or f"journal://{journal}"
    if storage is None and not journal.is_file():
        known = sorted(p.stem for p in studies_dir.glob("*.log")) \
            if studies_dir.is_dir() else []
        raise StudyError(f"no study {name!r} under {studies_dir}/",
                         hint=("studies here: " + ", ".join(known[:20])) if known
                         else "run qtune search first, or pass --storage URL")
    if storage is not None:
        check_storage_url(storage)
    try:
        study = optuna.load_study(study_name=name,
                                  storage=open_storage(url, read_only=True))
    except KeyError:
        raise StudyError(f"no study {name!r} in {mask_url(url)}",
                         hint="check the study name and --storage") from None
    return study, url


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


# -- SVG ----------------------------------------------------------------------
W, H, PAD = 560, 300, 48


def _scale(vals: list[float], lo_px: float, hi_px: float, log: bool = False
           ) -> Any:
    vs = [math.log10(v) if log else v for v in vals if v is not None and v > 0 or not log]
    lo, hi = (min(vs), max(vs)) if vs else (0.0, 1.0)
    if hi == lo:
        hi = lo + 1.0

    def f(v: float) -> float:
        x = math.log10(v) if log else v
        return lo_px + (x - lo) / (hi - lo) * (hi_px - lo_px)

    return f, lo, hi


def _axes(title: str, xlabel: str, ylabel: str) -> list[str]:
    return [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">',
            f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">'
            f"{html.escape(title)}</text>",
            f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#444"/>',
            f'<line x1="{PAD}" y1="30" x2="{PAD}" y2="{H - PAD}" stroke="#444"/>',
            f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">{html.escape(xlabel)}</text>',
            f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" '
            f'text-anchor="middle">{html.escape(ylabel)}</text>']


def history_svg(df: Any, objective: str, maximize: bool) -> str:
    ok = df[df["value"].notna()]
    if ok.empty:
        return "<p>No completed trial.</p>"
    xs = list(ok["trial"])
    ys = [float(v) for v in ok["value"]]
    fx, *_ = _scale(xs, PAD + 8, W - 20)
    fy, lo, hi = _scale(ys, H - PAD - 8, 36)
    out = _axes(f"optimisation history: {objective}", "trial", objective)
    best, pts = None, []
    for x, y, feas, base in zip(xs, ys, ok["feasible"], ok["baseline"], strict=True):
        colour = "#d62728" if not feas else ("#7f7f7f" if base else "#1f77b4")
        out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="4" fill="{colour}">'
                   f"<title>trial {x}: {y:.2f}</title></circle>")
        if feas:
            best = y if best is None else (max(best, y) if maximize else min(best, y))
        if best is not None:
            pts.append(f"{fx(x):.1f},{fy(best):.1f}")
    if pts:
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#2ca02c" '
                   'stroke-width="2"/>')
    out.append(f'<text x="{PAD + 4}" y="34" font-size="11">{hi:.4g}</text>'
               f'<text x="{PAD + 4}" y="{H - PAD - 4}" font-size="11">{lo:.4g}</text>')
    out.append("</svg>")
    return "\n".join(out)


def tradeoff_svg(df: Any, latency: str = "e2e_p99") -> str:
    col = f"{latency}_ms"
    ok = df[df["req_per_s"].notna() & df[col].notna()]
    if ok.empty:
        return ""
    xs, ys = [float(v) for v in ok["req_per_s"]], [float(v) for v in ok[col]]
    fx, xlo, xhi = _scale(xs, PAD + 8, W - 20)
    fy, ylo, yhi = _scale(ys, H - PAD - 8, 36)
    out = _axes("throughput against tail latency (Pareto points in green)",
                f"requests/s ({xlo:.3g} .. {xhi:.3g})", f"{latency} ms ({ylo:.4g} .. {yhi:.4g})")
    pareto = {i for i in range(len(xs)) if not any(
        xs[j] >= xs[i] and ys[j] <= ys[i] and (xs[j] > xs[i] or ys[j] < ys[i])
        for j in range(len(xs)))}
    for i, (x, y, n) in enumerate(zip(xs, ys, ok["trial"], strict=True)):
        colour = "#2ca02c" if i in pareto else "#1f77b4"
        out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="5" fill="{colour}">'
                   f"<title>trial {n}: {x:.2f} req/s, {y:.1f} ms</title></circle>")
    out.append("</svg>")
    return "\n".join(out)


def importance_svg(imp: dict[str, float]) -> str:
    if not imp:
        return "<p>Parameter importances need at least 3 completed tuned trials.</p>"
    h = 30 + 24 * len(imp)
    out = [f'<svg viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img">',
           '<text x="10" y="16" font-weight="bold">parameter importance (PED-ANOVA)</text>']
    for i, (k, v) in enumerate(sorted(imp.items(), key=lambda kv: -kv[1])):
        y = 28 + 24 * i
        out.append(f'<text x="10" y="{y + 14}" font-size="12">{html.escape(k)}</text>'
                   f'<rect x="230" y="{y}" width="{max(v, 0) * 300:.1f}" height="16" '
                   f'fill="#1f77b4"/><text x="{236 + max(v, 0) * 300:.1f}" y="{y + 13}" '
                   f'font-size="11">{v:.2f}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _latency(objective: str) -> str:
    from qtune.objectives import pareto_latency

    return pareto_latency(objective) or "e2e_p99"


def _quality_html(study: optuna.Study, df: Any) -> str:
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


def render_html(study: optuna.Study, url: str, df: Any, imp: dict[str, float]) -> str:
    objective = study.user_attrs.get(StudyAttr.OBJECTIVE, "value")
    maximize = maximizes(study)
    shown_url = html.escape(mask_url(url))
    cols = [c for c in df.columns if c not in ("detail",)]
    table = df[cols].to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}",
                             border=0, classes="trials")
    wl = study.user_attrs.get(StudyAttr.WORKLOAD, {})
    model = study.user_attrs.get(StudyAttr.MODEL, {})
    trade = tradeoff_svg(df, _latency(objective))
    fails = df[df["status"].isin([TrialStatus.STARTUP_FAILED, TrialStatus.LOAD_FAILED,
                                   TrialStatus.PRUNED, TrialStatus.INVALID])]
    quality = _quality_html(study, df)
    fail_rows = "".join(
        f"<li>trial {r.trial}: {html.escape(str(r.status))}: "
        f"{html.escape(str(r.reason))}: {html.escape(str(r.detail))[:300]}</li>"
        for r in fails.itertuples())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>qtune report: {html.escape(study.study_name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table.trials{{border-collapse:collapse;font-size:12px}}
table.trials td,table.trials th{{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}}
.grid{{display:flex;flex-wrap:wrap;gap:1em}} code{{background:#f4f4f4}}</style></head>
<body><h1>qtune study <code>{html.escape(study.study_name)}</code></h1>
<p>storage <code>{shown_url}</code>; model <code>{html.escape(str(model.get("id")))}</code>;
objective <b>{html.escape(objective)}</b> ({"max" if maximize else "min"}imise);
workload <code>{html.escape(str(wl))}</code></p>
<div class="grid">{history_svg(df, objective, maximize)}{trade}</div>
{importance_svg(imp)}
{_engines_html(study)}<h2>Trials</h2>{table}{quality}{_speculative_html(study)}
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
    if html_path:
        write_atomic(html_path, render_html(study, url, df, imp), force=force,
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
    return {"study": name, "storage": mask_url(url),
            "objective": study.user_attrs.get(StudyAttr.OBJECTIVE),
            "trials": df.to_dict(orient="records"), "best_trial": best,
            "importances": imp, "counts": counts,
            **({"engines": engines} if engines else {}),
            **({"speculative": _speculative_line(study)}
               if study.user_attrs.get(StudyAttr.SPECULATIVE) else {})}


def _speculative_line(study: optuna.Study) -> str:
    return summary_line(study.user_attrs[StudyAttr.SPECULATIVE])
