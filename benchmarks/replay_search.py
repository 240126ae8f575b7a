#!/usr/bin/env python3
"""Compare search strategies on a measured table, over many seeds.

On the 2-vCPU VM one measurement of a config varies by ~7% from the run and
5-10% from the server start (``noise_sources.py``), so live searches cannot
tell a 5% difference between strategies (``search_efficiency.py``,
``judge_picks.py``).  This is the tabular benchmark instead: a grid measured
once with several fresh starts per config (``replay_table.py``), and each
strategy run against it many times (``qtune.search.replay``).  qtune's own
search code runs (sampler, start design, the engine's space shaping, pruning,
confirmation); only each server start is answered with a draw of one of that
config's measured runs, so a search sees the table's real noise.

Methods, each at every launch budget (launches counted as ``--trials``
counts them: the engine defaults are the first):

- ``tpe``: qtune's default sampler, no confirmation; hands back the best
  single measurement.
- ``tpe+confirm``: qtune search as a user runs it: TPE and the top-K
  confirmation (``TuneConfig``'s ``confirm.top`` x ``confirm.repeats`` fresh
  starts, the defaults re-measured with them), whose launches come out of
  the same budget: --trials is the most that leaves room for them.
- ``tpe+cKxR``: the same with the top K confirmed R times each (the
  confirmation's settings compared on one table).
- ``gp``, ``random``: qtune's other samplers, no confirmation.
- ``design``: the start design alone (the Latin hypercube takes the budget).
- ``vllm-autotune``: vLLM's ``benchmarks/auto_tune/auto_tune.sh``: its grid,
  ``max_num_seqs`` outer and ``max_num_batched_tokens`` inner, one start
  each in the lists' order, the best measured kept.  Its rate step-down runs
  only when a config misses its latency limit, and this table's objective has
  none, so it never triggers here; a budget below the grid's size is the
  first configs of that order.

Scored by the TRUE quality of the config each search hands back: its median
over the table's runs, as a gap to the best config's median; and by how far
the improvement over the defaults it states is from the true one.  Also the cost:
launches and minutes (the drawn runs' start plus measurement) until the best
measured so far was truly within 5% of the best, at the largest budget.

    python benchmarks/replay_search.py TABLE_DIR [--seeds 50]
        [--budgets 4,6,8,10,12,16] [--methods tpe,gp,...] [--out DIR]

Writes ``outcomes.json`` (every search), ``summary.md`` and ``report.html``
(the gap against the budget, the report's SVG style) into ``--out``
(default: TABLE_DIR/replay-<timestamp>/).
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qtune.load.workload import Workload  # noqa: E402
from qtune.plots import PAD, H, W, axes, scale  # noqa: E402
from qtune.search.config import TuneConfig  # noqa: E402
from qtune.search.inputs import prepare  # noqa: E402
from qtune.search.replay import (  # noqa: E402
    METHODS,
    Outcome,
    Table,
    measured_grid,
    replay_search,
)

WITHIN = 0.05
COLOURS = {"tpe": "#1f77b4", "tpe+confirm": "#17becf", "gp": "#ff7f0e", "random": "#7f7f7f",
           "design": "#2ca02c", "vllm-autotune": "#d62728"}
# tpe+cKxR variants, in the order named
EXTRA_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#393b79", "#637939")


class Fallbacks(logging.Filter):
    """Counts (and keeps off the screen) Optuna's notes that a sampler drew a
    parameter at random instead of from its model."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "sampled independently" in record.getMessage():
            self.count += 1
            return False
        return True


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def table_prep(table: Table, work: Path) -> Any:
    """The Prepared a live search of the table's space and workload gets:
    the grid of the configs it measured (all of them, unless it was cut
    short), the table's fixed params."""
    grid = measured_grid(list(table.params.values()), tuple(table.meta["space"]))
    table.meta["space"] = grid
    space = work / "space.yaml"
    space.write_text("".join(f"{k}: {json.dumps(v)}\n"
                             for k, v in {**grid, **table.meta["fixed"]}.items()))
    return prepare(TuneConfig(engine="vllm", workload=Workload(**table.meta["workload"]),
                              objective=table.meta["objective"],
                              space_file=space, study="replay",
                              studies_dir=work / "studies",
                              profiles_dir=work / "profiles"))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summarise(table: Table, outs: list[Outcome], methods: list[str],
              budgets: list[int], default: str = "tpe+confirm"
              ) -> tuple[list[str], dict[str, Any]]:
    best_key, best_v = table.best()
    lines = ["## The table", "",
             f"{table.meta['engine']}, {table.meta['model']}; objective "
             f"{table.meta['objective']} ({table.meta['direction']}); best: "
             f"`{best_key or 'engine defaults'}` at {best_v:.1f}.", "",
             "| config | runs | median | min-max | gap to best |", "|---|---|---|---|---|"]
    for key in sorted(table.runs, key=table.true_value):
        vals = [table.value(r) for r in table.runs[key]]
        lines.append(f"| `{key or 'engine defaults'}` | {len(vals)} | "
                     f"{table.true_value(key):.1f} | {min(vals):.1f}-{max(vals):.1f} | "
                     f"{pct(table.gap(key))} |")
    data: dict[str, Any] = {"gap": {}, "within": {}, "reach": {}}
    lines += ["", "## The pick's true gap to the table's best: median [IQR] over seeds", "",
              "| method | " + " | ".join(f"{b} launches" for b in budgets) + " |",
              "|---|" + "---|" * len(budgets)]
    for m in methods:
        row = []
        for b in budgets:
            gaps = [o.gap for o in outs if o.method == m and o.budget == b
                    and o.gap is not None]
            if not gaps:
                row.append("-")
                continue
            lo, med, hi = quartiles(gaps)
            within = sum(g <= WITHIN for g in gaps) / len(gaps)
            data["gap"][f"{m}@{b}"] = {"q25": lo, "median": med, "q75": hi,
                                       "mean": statistics.fmean(gaps), "n": len(gaps)}
            data["within"][f"{m}@{b}"] = within
            row.append(f"{pct(med)} [{pct(lo)}, {pct(hi)}]")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines += ["", "## Share of seeds whose pick is truly within 5% of the best", "",
              "| method | " + " | ".join(f"{b}" for b in budgets) + " |",
              "|---|" + "---|" * len(budgets)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(
            f"{100 * data['within'][f'{m}@{b}']:.0f}%" if f"{m}@{b}" in data["within"]
            else "-" for b in budgets) + " |")
    top = max(budgets)
    lines += ["", f"## Cost to reach within 5% (runs at {top} launches; the best measured "
              "so far, unconfirmed)", "",
              "| method | reached | launches: median [IQR] | minutes: median [IQR] |",
              "|---|---|---|---|"]
    for m in methods:
        runs = [o for o in outs if o.method == m and o.budget == top and o.launches]
        got = [r for o in runs if (r := o.reach(table, WITHIN)) is not None]
        if not runs:
            continue
        if got:
            ln = quartiles([float(n) for n, _ in got])
            mn = quartiles([s / 60 for _, s in got])
            data["reach"][m] = {"share": len(got) / len(runs), "launches": ln, "minutes": mn}
            lines.append(f"| {m} | {len(got)}/{len(runs)} | {ln[1]:.0f} [{ln[0]:.0f}, "
                         f"{ln[2]:.0f}] | {mn[1]:.1f} [{mn[0]:.1f}, {mn[2]:.1f}] |")
        else:
            lines.append(f"| {m} | 0/{len(runs)} | - | - |")
    lines += ["", "## The improvement each search states against the true one", "",
              "The search's own figure (the profile's `improvement` over the engine "
              "defaults: confirmation medians where both were re-measured, else one run "
              "each) over the true one (the table's medians of the pick and the defaults), "
              "minus 1: +10% claims 10% more gain than there is. Median [IQR] over seeds; "
              "in brackets after it, the share of seeds that overstate by more than 5%.", "",
              "| method | " + " | ".join(f"{b} launches" for b in budgets) + " |",
              "|---|" + "---|" * len(budgets)]
    data["claim"] = {}
    for m in methods:
        row = []
        for b in budgets:
            errs = [e for o in outs if o.method == m and o.budget == b
                    and (e := o.claim_error) is not None]
            if not errs:
                row.append("-")
                continue
            lo, med, hi = quartiles(errs)
            over = sum(e > WITHIN for e in errs) / len(errs)
            data["claim"][f"{m}@{b}"] = {"q25": lo, "median": med, "q75": hi,
                                         "over_5pct": over, "n": len(errs)}
            row.append(f"{pct(med)} [{pct(lo)}, {pct(hi)}] ({100 * over:.0f}%)")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines += ["", f"## Where the default ({default}) is not at least as good, from 10 "
              "launches up", ""]
    worse = []
    for b in [b for b in budgets if b >= 10]:
        t = data["gap"].get(f"{default}@{b}")
        for m in methods:
            o = data["gap"].get(f"{m}@{b}")
            if m == default or t is None or o is None:
                continue
            if o["median"] < t["median"] - 1e-9 or o["mean"] < t["mean"] - 1e-9:
                worse.append(f"- {b} launches: {m} median {pct(o['median'])} / mean "
                             f"{pct(o['mean'])} against {default}'s {pct(t['median'])} / "
                             f"{pct(t['mean'])}")
    lines += worse or [f"- nowhere: {default}'s median and mean gap are the lowest at "
                       "every budget from 10 up"]
    data["worse"] = worse
    return lines, data


Bands = dict[str, list[tuple[int, float, float, float]]]


def gap_bands(outs: list[Outcome], methods: list[str], budgets: list[int]) -> Bands:
    """Per method, (budget, q25, median, q75) of the pick's true gap in %, for
    the budgets where it has one: what the report's plot draws."""
    meds: Bands = {}
    for m in methods:
        for b in budgets:
            gaps = [o.gap for o in outs if o.method == m and o.budget == b
                    and o.gap is not None]
            if gaps:
                lo, med, hi = quartiles(gaps)
                meds.setdefault(m, []).append((b, lo * 100, med * 100, hi * 100))
    return meds


def svg(meds: Bands, budgets: list[int]) -> str:
    """Median gap (line) and IQR (band) against the budget, per method."""
    ys = [v for pts in meds.values() for p in pts for v in p[1:]] + [0.0]
    fx, *_ = scale([float(b) for b in budgets], PAD + 8, W - 110)
    fy, lo_y, hi_y = scale(ys, H - PAD - 8, 36)
    out = axes("pick's true gap to the table's best (median, IQR band)", "launches",
                "gap %")
    for i, (m, pts) in enumerate(meds.items()):
        c = COLOURS.get(m, EXTRA_COLOURS[i % len(EXTRA_COLOURS)])
        band = [f"{fx(b):.1f},{fy(hi):.1f}" for b, _, _, hi in pts] + \
            [f"{fx(b):.1f},{fy(lo):.1f}" for b, lo, _, _ in reversed(pts)]
        out.append(f'<polygon points="{" ".join(band)}" fill="{c}" fill-opacity="0.08"/>')
        line = " ".join(f"{fx(b):.1f},{fy(md):.1f}" for b, _, md, _ in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        for b, _, md, _ in pts:
            out.append(f'<circle cx="{fx(b):.1f}" cy="{fy(md):.1f}" r="3" fill="{c}">'
                       f"<title>{html.escape(m)} at {b}: {md:.1f}%</title></circle>")
        out.append(f'<text x="{W - 100}" y="{40 + 16 * i}" fill="{c}" font-size="12">'
                   f"{html.escape(m)}</text>")
    for b in budgets:
        out.append(f'<text x="{fx(float(b)):.1f}" y="{H - PAD + 14}" font-size="11" '
                   f'text-anchor="middle">{b}</text>')
    out.append(f'<text x="{PAD + 4}" y="34" font-size="11">{hi_y:.3g}%</text>'
               f'<text x="{PAD + 4}" y="{H - PAD - 4}" font-size="11">{lo_y:.3g}%</text>')
    out.append("</svg>")
    return "\n".join(out)


def page(table_name: str, meds: Bands, budgets: list[int], body: str) -> str:
    """``report.html``: the plot over the summary's text.  Also rebuilt from a
    committed ``summary.json`` and ``summary.md`` by ``rebuild_reports.py``."""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>qtune replay</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
            "pre{white-space:pre-wrap}</style></head><body>"
            f"<h1>qtune search replay: {html.escape(table_name)}</h1>"
            f"{svg(meds, budgets)}<pre>{html.escape(body)}</pre></body></html>\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--budgets", default="4,6,8,10,12,16")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--default", default="tpe+confirm",
                    help="the method the others are held against (qtune search as a "
                    "user runs it)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    methods = args.methods.split(",")
    table = Table.load(args.table)
    out = args.out or args.table / f"replay-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    # Thousands of throwaway journals: in memory where there is a tmpfs (the
    # journal's fsync per write is most of a replayed search's time on disk).
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="replay-search-",
                                 dir=shm if shm.is_dir() else None))
    prep = table_prep(table, work)
    outs: list[Outcome] = []
    fallbacks = Fallbacks()
    for h in logging.getLogger("optuna").handlers:
        h.addFilter(fallbacks)
    random_draws: dict[str, int] = {}
    t0 = time.monotonic()
    for m in methods:
        tm = time.monotonic()
        before = fallbacks.count
        for b in budgets:
            for seed in range(args.seeds):
                outs.append(replay_search(prep, table, m, b, seed, work / "studies"))
        random_draws[m] = fallbacks.count - before
        print(f"{m}: {len(budgets) * args.seeds} searches in {time.monotonic() - tm:.0f} s"
              f", {random_draws[m]} parameter draws outside the sampler's model", flush=True)
    rows = [{"method": o.method, "budget": o.budget, "seed": o.seed, "pick": o.pick,
             "gap": o.gap, "claimed": o.claimed, "true_gain": o.true_gain,
             "launches": [[la.key, la.value, round(la.seconds, 2)]
                                        for la in o.launches]} for o in outs]
    (out / "outcomes.json").write_text(json.dumps(rows) + "\n")
    lines, data = summarise(table, outs, methods, budgets, args.default)
    data["draws_outside_model"] = random_draws
    lines += ["", "Parameter draws Optuna made at random instead of from the sampler's model "
              "(its 'sampled independently' note): " + ", ".join(
                  f"{m} {n}" for m, n in random_draws.items()) + "."]
    head = [f"# Replay of {args.table.name}: {len(methods)} methods x {len(budgets)} budgets "
            f"x {args.seeds} seeds", "",
            f"`python benchmarks/replay_search.py {' '.join(sys.argv[1:])}` "
            f"({(time.monotonic() - t0) / 60:.1f} min)", ""]
    (out / "summary.md").write_text("\n".join(head + lines) + "\n")
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    body = "\n".join(head + lines)
    (out / "report.html").write_text(
        page(args.table.name, gap_bands(outs, methods, budgets), budgets, body))
    shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
