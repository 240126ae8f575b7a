#!/usr/bin/env python3
"""Rebuild the generated reports of ``benchmarks/results/`` from the raw data
committed beside them, so that no generated page is committed.

Today these are the replay reports: every ``summary.json`` with its
``summary.md`` under a ``replay*/`` folder of a ``replay-table-*`` result
gets its ``report.html`` back, drawn by ``replay_search.page`` (the plot in
qtune's own report style, ``qtune.report``) from the gap quartiles that
``summary.json`` keeps and the text of ``summary.md``: the same page
``replay_search.py`` wrote when it ran.  The budgets are the columns of the
summary's gap table; the table's name is the result folder's.

    python benchmarks/rebuild_reports.py [RESULTS_DIR] [--check]

``--check`` writes nothing and exits 1 when a summary cannot be read back
into a page.  The pages are ignored by git (``.gitignore``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # replay_search, and qtune
from replay_search import Bands, page  # noqa: E402

BUDGETS = re.compile(r"^\| method \|((?: \d+ launches \|)+)$", re.M)


def replay_page(folder: Path) -> str:
    """``report.html`` of one replay output folder, from its summaries."""
    data = json.loads((folder / "summary.json").read_text())
    body = (folder / "summary.md").read_text().rstrip("\n")
    head = BUDGETS.search(body)
    if head is None:
        raise ValueError(f"{folder / 'summary.md'}: no gap table with budgets")
    budgets = [int(b) for b in re.findall(r"(\d+) launches", head.group(1))]
    bands: Bands = {}
    for key, q in data["gap"].items():  # methods in order, each one's budgets in order
        method, budget = key.rsplit("@", 1)
        bands.setdefault(method, []).append(
            (int(budget), q["q25"] * 100, q["median"] * 100, q["q75"] * 100))
    return page(folder.parent.name, bands, budgets, body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", type=Path, default=HERE / "results")
    ap.add_argument("--check", action="store_true", help="build in memory, write nothing")
    args = ap.parse_args()
    folders = sorted(p.parent for p in args.results.glob("replay-table-*/replay*/summary.json"))
    if not folders:
        print(f"no replay summaries under {args.results}", file=sys.stderr)
        return 1
    for folder in folders:
        text = replay_page(folder)
        if not args.check:
            (folder / "report.html").write_text(text)
        print(("built " if args.check else "wrote ") + str(folder / "report.html"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
