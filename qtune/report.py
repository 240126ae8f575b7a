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
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from qtune.errors import InputError, StudyError, clip, mask_url, printable
from qtune.files import check_target, csv_text, write_atomic
from qtune.objectives import get_objective
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


# -- SVG ----------------------------------------------------------------------
W, H, PAD = 560, 300, 48
LANE_Y = H - PAD + 8  # trials without a value, under the x axis's tick labels


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


def ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round values spanning [lo, hi] (1, 2 or 5 times a power
    of ten apart), for an axis a reader can read values off; whole numbers
    only when ``integer`` (trial numbers)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    # the round step whose tick count is nearest n
    step = min((m * mag for m in (1, 2, 5, 10)),
               key=lambda st: abs((hi - lo) / st - n))
    if integer:
        step = max(step, 1.0)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step) + 1)]


def _tick_text(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _plot(title: str, xlabel: str, ylabel: str, xs: list[float], ys: list[float],
          lane: bool = False) -> tuple[list[str], Any, Any]:
    """An SVG frame with ticked, labelled axes over the data's range (and a
    'no value' lane under the x axis for trials without one); the x and y
    scales."""
    bottom = H - PAD - (30 if lane else 0)
    xlo, xhi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    ylo, yhi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    # a margin so that the extreme points and their labels are inside
    xpad = (xhi - xlo) * 0.05 or 1.0
    ypad = (yhi - ylo) * 0.08 or max(abs(yhi) * 0.1, 1.0)
    xlo, xhi, ylo, yhi = xlo - xpad, xhi + xpad, ylo - ypad, yhi + ypad
    left = PAD + 24

    def fx(v: float) -> float:
        return left + (v - xlo) / (xhi - xlo) * (W - 20 - left)

    def fy(v: float) -> float:
        return bottom - (v - ylo) / (yhi - ylo) * (bottom - 36)

    out = [f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{html.escape(title)}">',
           f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="bold">'
           f"{html.escape(title)}</text>",
           f'<line x1="{left}" y1="{bottom}" x2="{W - 10}" y2="{bottom}" stroke="#444"/>',
           f'<line x1="{left}" y1="30" x2="{left}" y2="{bottom}" stroke="#444"/>',
           f'<text x="{(left + W) / 2}" y="{H - 6}" text-anchor="middle">'
           f"{html.escape(xlabel)}</text>",
           f'<text x="12" y="{bottom / 2 + 15}" transform="rotate(-90 12 '
           f'{bottom / 2 + 15})" text-anchor="middle">{html.escape(ylabel)}</text>']
    for v in ticks(xlo + xpad, xhi - xpad, integer=xlabel == "trial"):
        out.append(f'<line x1="{fx(v):.1f}" y1="{bottom}" x2="{fx(v):.1f}" '
                   f'y2="{bottom + 4}" stroke="#444"/><text class="tick" x="{fx(v):.1f}" '
                   f'y="{bottom + 15}" text-anchor="middle">{_tick_text(v)}</text>')
    for v in ticks(ylo + ypad, yhi - ypad):
        out.append(f'<line x1="{left - 4}" y1="{fy(v):.1f}" x2="{W - 10}" y2="{fy(v):.1f}" '
                   f'stroke="#eee"/><text class="tick" x="{left - 6}" y="{fy(v) + 4:.1f}" '
                   f'text-anchor="end">{_tick_text(v)}</text>')
    if lane:
        out.append(f'<text class="tick" x="{left - 6}" y="{LANE_Y + 4}" text-anchor="end">'
                   "no value</text>")
    return out, fx, fy


# How a trial is drawn: fill, shape and the legend's word for it.
_MARKS = {"winner": ("#2ca02c", "star", "recommended"),
          "baseline": ("#7f7f7f", "square", "engine defaults"),
          "ok": ("#1f77b4", "circle", "feasible"),
          "infeasible": ("#d62728", "ring", "missed the SLO / failed requests"),
          "pruned": ("#ff7f0e", "triangle", "pruned (stopped early)"),
          "failed": ("#d62728", "cross", "failed to start or under load"),
          "worker_lost": ("#9467bd", "cross", "worker lost (re-run)"),
          "invalid": ("#8c564b", "cross", "refused before launch")}


def _mark(kind: str, x: float, y: float, tip: str, label: str) -> str:
    colour, shape, _ = _MARKS[kind]
    tip = f"<title>{html.escape(tip)}</title>"
    if shape == "circle":
        m = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}">{tip}</circle>'
    elif shape == "ring":
        m = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="white" stroke="{colour}" '
             f'stroke-width="2">{tip}</circle>')
    elif shape == "square":
        m = (f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" '
             f'fill="{colour}">{tip}</rect>')
    elif shape == "triangle":
        m = (f'<path d="M{x:.1f},{y - 5:.1f} L{x + 5:.1f},{y + 4:.1f} L{x - 5:.1f},'
             f'{y + 4:.1f} Z" fill="{colour}">{tip}</path>')
    elif shape == "star":
        m = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="{colour}" '
             f'stroke-width="2"/><circle cx="{x:.1f}" cy="{y:.1f}" r="4" '
             f'fill="{colour}">{tip}</circle>')
    else:  # cross
        m = (f'<path d="M{x - 4:.1f},{y - 4:.1f} L{x + 4:.1f},{y + 4:.1f} M{x - 4:.1f},'
             f'{y + 4:.1f} L{x + 4:.1f},{y - 4:.1f}" stroke="{colour}" '
             f'stroke-width="2">{tip}</path>')
    return m + (f'<text class="label" x="{x + 6:.1f}" y="{y - 5:.1f}">{html.escape(label)}'
                "</text>")


class Row(dict[str, Any]):
    """A trials-table row read by attribute, a gap (NaN, None, missing) as
    None: pandas' itertuples drops dotted column names."""

    def __getattr__(self, key: str) -> Any:
        v = self.get(key)
        return None if isinstance(v, float) and v != v else v


def rows(df: pd.DataFrame) -> list[Row]:
    return [Row({str(k): v for k, v in r.items()}) for r in df.to_dict(orient="records")]


def _kind(r: Any, best: int | None) -> str:
    if r.trial == best:
        return "winner"
    if r.status == TrialStatus.OK:
        return "baseline" if r.baseline is True else ("ok" if r.feasible else "infeasible")
    if r.status == TrialStatus.PRUNED:
        return "pruned"
    if r.status == "worker_lost":
        return "worker_lost"
    if r.status == TrialStatus.INVALID:
        return "invalid"
    return "failed"


def _why(r: Any, limit: int | None = 200) -> str:
    """A trial's tooltip (its detail clipped at a word to ``limit``; whole
    with None, for the list of failures): its status, reason, and in a fleet
    its worker and the retry that replaced it."""
    parts = [f"trial {r.trial}: {r.status}"]
    if isinstance(r.reason, str) and r.reason != r.status:
        parts.append(r.reason)
    if isinstance(r.detail, str) and r.detail:
        parts.append(r.detail if limit is None else clip(r.detail, limit))
    for key, label in (("worker", "worker"), ("retry_of", "re-runs trial"),
                       ("retried_by", "re-run as trial")):
        v = getattr(r, key)
        if v is not None:
            parts.append(f"{label} {int(v) if isinstance(v, float) else v}")
    return "; ".join(parts)


def _legend(kinds: set[str]) -> str:
    items = [f'<span class="key" style="color:{_MARKS[k][0]}">&#9679;</span> '
             f"{html.escape(_MARKS[k][2])}" for k in _MARKS if k in kinds]
    return '<p class="legend">' + " &nbsp; ".join(items) + "</p>" if items else ""


def history_svg(df: pd.DataFrame, objective: str, maximize: bool, unit: str = "",
                best: int | None = None) -> str:
    """Each trial's objective by trial number, with the best-so-far line;
    trials without a value (pruned, failed, refused, lost) in a lane below."""
    if df.empty:
        return "<p>No trial ran.</p>"
    table = rows(df)
    xs = [float(r.trial) for r in table]
    ys = [float(r.value) for r in table if r.value is not None]
    ylabel = f"{objective} ({unit})" if unit else objective
    better = "higher" if maximize else "lower"
    out, fx, fy = _plot(f"optimisation history: {objective} ({better} is better)", "trial",
                        ylabel, xs, ys,
                        lane=len(ys) < len(table))
    running, pts, kinds = None, [], set()
    for r in table:
        kind = _kind(r, best)
        kinds.add(kind)
        x = fx(float(r.trial))
        if r.value is not None:
            y = float(r.value)
            tip = f"{_why(r)}; {objective} {_tick_text(y)} {unit}".strip()
            out.append(_mark(kind, x, fy(y), tip, str(r.trial)))
            if r.feasible is True:
                running = y if running is None else (max(running, y) if maximize
                                                     else min(running, y))
        else:
            out.append(_mark(kind, x, LANE_Y, _why(r), str(r.trial)))
        if running is not None:
            pts.append(f"{x:.1f},{fy(running):.1f}")
    if pts:
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#2ca02c" '
                   'stroke-width="1.5" stroke-dasharray="4 2"><title>best so far</title>'
                   "</polyline>")
    out.append("</svg>")
    return "\n".join(out) + _legend(kinds)


def _tradeoff_axes(objective: str) -> tuple[str, str, str, str]:
    """The columns and labels of the trade-off plot: the objective's own
    metric on its axis, against throughput (or e2e p99 for a rate)."""
    try:
        obj = get_objective(objective)
    except InputError:  # a study of a qtune that knew other objectives
        obj = get_objective("e2e_p99")
    if obj.direction in ("minimize", "pareto"):
        return "req_per_s", "throughput (req/s)", f"{obj.run_metric}_ms", \
            f"{obj.run_metric} (ms)"
    x, xl = {"output_throughput": ("out_tok_per_s", "output throughput (tok/s)"),
             "goodput": ("value", "goodput (req/s under the SLO)")}.get(
        obj.name, ("req_per_s", "throughput (req/s)"))
    return x, xl, "e2e_p99_ms", "e2e_p99 (ms)"


def tradeoff_svg(df: pd.DataFrame, objective: str = "e2e_p99", best: int | None = None,
                 unit: str = "", steps: dict[int, list[dict[str, Any]]] | None = None
                 ) -> str:
    """Throughput against the objective's latency (Pareto points ringed); a
    capacity study's brackets."""
    if objective == "capacity":
        return capacity_svg(df, best, unit, steps)
    xcol, xlabel, ycol, ylabel = _tradeoff_axes(objective)
    if xcol not in df or ycol not in df:
        return ""
    ok = df[df[xcol].notna() & df[ycol].notna()]
    if ok.empty:
        return ""
    xs, ys = [float(v) for v in ok[xcol]], [float(v) for v in ok[ycol]]
    out, fx, fy = _plot(f"{xlabel.split(' (')[0]} against {ylabel.split(' (')[0]}",
                        xlabel, ylabel, xs, ys)
    pareto = {i for i in range(len(xs)) if not any(
        xs[j] >= xs[i] and ys[j] <= ys[i] and (xs[j] > xs[i] or ys[j] < ys[i])
        for j in range(len(xs)))}
    kinds = set()
    for i, r in enumerate(rows(ok)):
        kind = _kind(r, best)
        kinds.add(kind)
        if i in pareto:
            out.append(f'<circle cx="{fx(xs[i]):.1f}" cy="{fy(ys[i]):.1f}" r="9" '
                       'fill="none" stroke="#2ca02c" stroke-dasharray="2 2"/>')
        out.append(_mark(kind, fx(xs[i]), fy(ys[i]),
                         f"{_why(r)}; {xs[i]:.3g} / {ys[i]:.4g}", str(r.trial)))
    out.append("</svg>")
    return "\n".join(out) + _legend(kinds) + \
        '<p class="legend">dashed ring: on the Pareto front (no trial better on both)</p>'


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


def capacity_svg(df: pd.DataFrame, best: int | None = None, unit: str = "",
                 steps: dict[int, list[dict[str, Any]]] | None = None) -> str:
    """A capacity study: each trial's bracket [held, failed) as a bar, the
    load it held as a dot; a trial decided by one probe below the best so
    far, or that failed, drawn as such."""
    if "value" not in df or df.empty:
        return ""
    table = rows(df)
    held = [float(r.value) for r in table if r.value is not None]
    tops = [float(v) for r in table if r.value is not None
            and isinstance(v := r.get("capacity.failed_at"), (int, float)) and v == v]
    steps = steps or {}
    tops += [float(p["load"]) for ps in steps.values() for p in ps]
    out, fx, fy = _plot("capacity: each trial's bracket [held, failed)", "trial",
                        f"load held ({unit})" if unit else "load held",
                        [float(r.trial) for r in table], held + tops,
                        lane=len(held) < len(table))
    kinds = set()
    for r in table:
        kind = _kind(r, best)
        kinds.add(kind)
        x = fx(float(r.trial))
        for i, p in enumerate(steps.get(int(r.trial), [])):
            # each probe, in order, a little to the left: held (green) or not (red)
            colour = "#2ca02c" if p.get("ok") else "#d62728"
            out.append(f'<circle cx="{x - 10:.1f}" cy="{fy(float(p["load"])):.1f}" r="2.5" '
                       f'fill="{colour}"><title>trial {r.trial} probe {i + 1}: '
                       f'{float(p["load"]):g} {html.escape(unit)}: '
                       f'{html.escape(str(p.get("why") or ""))}</title></circle>')
        if r.value is not None:
            top = r.get("capacity.failed_at")
            if isinstance(top, (int, float)) and top == top:
                out.append(f'<line x1="{x:.1f}" y1="{fy(float(r.value)):.1f}" x2="{x:.1f}" '
                           f'y2="{fy(float(top)):.1f}" stroke="#bbb" stroke-width="6">'
                           f"<title>trial {r.trial}: held {r.value:g}, failed at "
                           f"{top:g}</title></line>")
            out.append(_mark(kind, x, fy(float(r.value)),
                             f"{_why(r)}; held {float(r.value):g}", str(r.trial)))
        else:
            out.append(_mark(kind, x, LANE_Y, _why(r), str(r.trial)))
    out.append("</svg>")
    return "\n".join(out) + _legend(kinds) + \
        '<p class="legend">grey bar: from the load held to the load that failed; small ' \
        "dots left of it: the probes (green held, red did not)</p>"


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
        items.append("<li><b>Config</b>: the engine defaults (no config beat them)</li>")
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
        items.append(f"<li><b>Deploy</b>: <code>{html.escape(rec.emit_command)}</code></li>")
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
    return "-" if v is None else f"{_tick_text(v)} {html.escape(unit)}"


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
    fail_rows = "".join(f"<li>{html.escape(_why(r, None))}</li>" for r in rows(fails))
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
