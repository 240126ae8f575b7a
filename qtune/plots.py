"""The report's plots as inline SVG (no scripts, no network): ticked,
labelled axes, each trial drawn by its outcome (winner, defaults, feasible,
infeasible, pruned, failed, lost, refused) with its reason as a tooltip,
and a legend of the kinds drawn.  ``qtune.report`` lays them out."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from qtune.errors import InputError, clip
from qtune.objectives import get_objective
from qtune.search.records import TrialStatus

if TYPE_CHECKING:
    import pandas as pd

W, H, PAD = 560, 300, 48
LANE_Y = H - PAD + 8  # trials without a value, under the x axis's tick labels


def scale(vals: list[float], lo_px: float, hi_px: float, log: bool = False
           ) -> Any:
    vs = [math.log10(v) if log else v for v in vals if v is not None and v > 0 or not log]
    lo, hi = (min(vs), max(vs)) if vs else (0.0, 1.0)
    if hi == lo:
        hi = lo + 1.0

    def f(v: float) -> float:
        x = math.log10(v) if log else v
        return lo_px + (x - lo) / (hi - lo) * (hi_px - lo_px)

    return f, lo, hi


def axes(title: str, xlabel: str, ylabel: str) -> list[str]:
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


def tick_text(v: float) -> str:
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
                   f'y="{bottom + 15}" text-anchor="middle">{tick_text(v)}</text>')
    for v in ticks(ylo + ypad, yhi - ypad):
        out.append(f'<line x1="{left - 4}" y1="{fy(v):.1f}" x2="{W - 10}" y2="{fy(v):.1f}" '
                   f'stroke="#eee"/><text class="tick" x="{left - 6}" y="{fy(v) + 4:.1f}" '
                   f'text-anchor="end">{tick_text(v)}</text>')
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


def trial_why(r: Any, limit: int | None = 200) -> str:
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
            tip = f"{trial_why(r)}; {objective} {tick_text(y)} {unit}".strip()
            out.append(_mark(kind, x, fy(y), tip, str(r.trial)))
            if r.feasible is True:
                running = y if running is None else (max(running, y) if maximize
                                                     else min(running, y))
        else:
            out.append(_mark(kind, x, LANE_Y, trial_why(r), str(r.trial)))
        if running is not None:
            pts.append(f"{x:.1f},{fy(running):.1f}")
    if pts:
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#2ca02c" '
                   'stroke-width="1.5" stroke-dasharray="4 2"><title>best so far</title>'
                   "</polyline>")
    out.append("</svg>")
    return "\n".join(out) + _legend(kinds)


def tradeoff_axes(objective: str) -> tuple[str, str, str, str]:
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
    xcol, xlabel, ycol, ylabel = tradeoff_axes(objective)
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
                         f"{trial_why(r)}; {xs[i]:.3g} / {ys[i]:.4g}", str(r.trial)))
    out.append("</svg>")
    return "\n".join(out) + _legend(kinds) + \
        '<p class="legend">dashed ring: on the Pareto front (no trial better on both)</p>'


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
                             f"{trial_why(r)}; held {float(r.value):g}", str(r.trial)))
        else:
            out.append(_mark(kind, x, LANE_Y, trial_why(r), str(r.trial)))
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
