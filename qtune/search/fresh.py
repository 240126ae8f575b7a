"""Configs measured again, each on a fresh start: the top-K confirmation
and the speculative-decoding A/B (``remeasure``), and what a capacity
confirmation's start probes (``confirm_plan``).  Apart from ``trial``,
which runs a trial once on its own server."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from qtune import seeds
from qtune.capacity import CapacityPlan
from qtune.engines import trial_spec
from qtune.errors import ServerError
from qtune.measure import interleaved, measure_server
from qtune.objectives import get_objective
from qtune.params import JSONObject
from qtune.search.config import TuneConfig
from qtune.search.inputs import Prepared
from qtune.search.records import TrialRecord
from qtune.search.reporter import Reporter
from qtune.search.trial import bench_config
from qtune.seeds import Phase
from qtune.server import free_port


def remeasure(prep: Prepared, items: list[TrialRecord], repeats: int, reporter: Reporter,
              *, phase: str, log_name: str, seed_phase: Phase,
              on_run: Callable[[TrialRecord, JSONObject], None] | None = None,
              at: dict[int, float] | None = None, refine: bool = False,
              end: float | None = None,
              ) -> tuple[dict[int, list[float]], dict[int, int]]:
    """Each of ``items`` measured ``repeats`` times more, each time on a fresh
    start, in rotated order (``interleaved``), each round with prompts of its
    own (``seed_phase``'s seed of the round, ``qtune.seeds``): the objective's values
    per trial number, and the rounds that failed (no start, or a failed
    request).  ``on_run(record, summary)`` sees every measured round.  The
    top-K confirmation and the speculative-decoding A/B both re-measure so.
    ``at``: for a capacity, the load a config is asked to hold instead of its
    own (the defaults, at the best config's capacity).  ``refine``: a
    capacity that fails on its fresh start and holds its fallback far below
    is probed once more between the two (``CapacityPlan.refine``); with
    ``end``, the study's end under ``--time-budget`` (``time.monotonic()``),
    only in the last run, only when each config has one fresh start, and
    only when that probe ends before ``end``: the runs before it are what
    the budget planned, and the middle rung is not in that plan.  (With more
    fresh starts a config's confirmed load is the lowest any of them held,
    ``confirmed_bracket``, so a middle on one start alone changes nothing.)"""
    cfg = prep.cfg
    values: dict[int, list[float]] = {r.number: [] for r in items}
    failures: dict[int, int] = {r.number: 0 for r in items}
    runs = list(interleaved(items, repeats))
    for i, (rep, r) in enumerate(runs):
        last = i == len(runs) - 1
        plan = confirm_plan(cfg, r, (at or {}).get(r.number),
                            refine=refine and (end is None or (last and repeats == 1)),
                            deadline=end if last else None)
        reporter.trial_phase(r.number, phase, f"repeat {rep + 1}/{repeats}")
        sub = prep.of(r.engine)  # --engine a,b: the trial's own engine
        spec = trial_spec(sub.engine, r.params, sub.ctx, free_port())
        log = prep.study_dir / f"{log_name}-{r.number:03d}-{rep}.log"
        wl = dataclasses.replace(cfg.workload, seed=seeds.seed(cfg.workload.seed, seed_phase, rep))
        try:
            m = measure_server(spec, log, bench_config(sub, spec, wl),
                               startup_timeout=cfg.startup_timeout,
                               classify=sub.engine.classify,
                               capacity=plan)
        except ServerError:
            failures[r.number] += 1  # does not restart reliably
            continue
        summary = m.to_dict()
        if m.capacity_result is not None:
            # A capacity is confirmed when the load asked for holds again.
            v = m.capacity_result.value if m.capacity_result.found else None
        else:
            v = get_objective(cfg.objective).value(summary)
        if v is not None and m.failed == 0:
            values[r.number].append(v)
        else:
            failures[r.number] += 1
        if on_run is not None:
            on_run(r, summary)
    return values, failures


def confirm_plan(cfg: TuneConfig, r: TrialRecord, load: float | None = None, *,
                 refine: bool = False, deadline: float | None = None
                 ) -> CapacityPlan | None:
    """A capacity config's confirmation run: one sustained probe at the
    capacity it was found to hold (or at ``load``, a challenge), on a fresh
    start (not a new search), and if it does not hold, one at the next
    lower load on the same start: the highest load below it that the config
    held in its search, or, for a challenge, its own capacity.  None for
    other objectives.  ``refine`` and ``deadline``: a middle rung when the
    fallback held far below (``CapacityPlan.refine``), never for a challenge."""
    cap = (r.summary or {}).get("capacity") or {}
    if cfg.objective != "capacity" or not cap.get("found") or r.value is None:
        return None
    x = float(r.value if load is None else load)
    if load is None:
        held = [float(st["load"]) for st in cap.get("steps") or []
                if st.get("ok") and float(st["load"]) < x]
        fallback = max(held) if held else None
    else:
        fallback = float(r.value) if r.value < x else None
    return CapacityPlan(start=x, floor=x, window_s=cap.get("window_s"), confirm=True,
                        tolerance=cfg.capacity.tolerance,
                        floor_of=f"trial {r.number}", fallback=fallback,
                        refine=refine and load is None and fallback is not None,
                        deadline=deadline)
