"""What a study can optimise, and the SLOs it is judged under: the one place
search, pruning, bench, verify, console and report ask.

Below all of them (it imports no Optuna, no engine and no search), so
``qtune bench`` reads an ``--slo`` without loading the search.  A new
objective is one entry of ``OBJECTIVES``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from qtune.errors import InputError
from qtune.metrics import metric_value


@dataclass(frozen=True)
class Objective:
    name: str
    direction: str  # minimize | maximize | pareto (throughput up, latency down)
    # The metric one run at a fixed load judges it by (verify, pruning, the
    # pareto latency): itself for a plain metric; goodput for capacity (a run
    # at one load cannot re-find the capacity, but shows whether it holds).
    run_metric: str
    needs_slo: bool = False  # goodput and capacity count requests meeting --slo
    # Can a trial be stopped mid-run once it cannot beat the best?  Only a
    # per-request latency percentile: its final value is bounded from the
    # requests already finished or in flight (qtune.search.pruning).
    prunable: bool = False
    # Is each trial first asked to hold the best value so far, and stopped
    # when it cannot?  (capacity: the floor probe.)  Then a config that did
    # not beat the engine defaults cannot win their confirmation (the
    # defaults win a tie), so the confirmation and its reserve leave it out.
    gated: bool = False
    help: str = ""

    @property
    def is_pareto(self) -> bool:
        return self.direction == "pareto"

    @property
    def sign(self) -> int:
        """+1 when lower is better, -1 when higher is: ``min(key=sign * v)``
        picks the best.  Pareto: its single value is its latency."""
        return -1 if self.direction == "maximize" else 1

    @property
    def judged_metrics(self) -> tuple[str, ...]:
        """What one run at the profile's load is compared on (``qtune
        check``): the objective's own metric; for a Pareto point both its
        coordinates, since a point that kept its latency by losing
        throughput has moved along the front, not stayed on it.  Capacity
        is judged apart (does the SLO hold at it?): its metric is goodput."""
        if self.is_pareto:
            return (self.run_metric, "throughput")
        return (self.run_metric,)

    @property
    def study_values(self) -> list[str]:
        """What the study's values are, in order (Optuna's metric names,
        which optuna-dashboard labels its axes with)."""
        if self.is_pareto:
            return ["throughput", self.run_metric]
        return [self.name]

    @property
    def confirmed_metric(self) -> str | None:
        """The metric the confirmation's medians are in (the study's value):
        the run metric, except capacity (a load, not a run's metric)."""
        return None if self.name == "capacity" else self.run_metric

    def value(self, summary: dict[str, Any]) -> float | None:
        """The objective's value in a measurement summary (for pareto, its
        latency: throughput is the study's other value)."""
        if self.name == "capacity":
            cap = summary.get("capacity") or {}
            return float(cap["value"]) if cap.get("found") else 0.0
        return metric_value(summary, self.run_metric)


def _latency(name: str, prunable: bool) -> Objective:
    return Objective(name, "minimize", name, prunable=prunable)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    _latency("e2e_p99", True),
    _latency("ttft_p99", True),
    _latency("tpot_p99", True),
    _latency("itl_p99", False),  # a request's ITLs are not bounded while it runs
    _latency("e2e_p50", True),
    _latency("ttft_p50", True),
    _latency("tpot_p50", True),
    Objective("throughput", "maximize", "throughput"),
    Objective("output_throughput", "maximize", "output_throughput"),
    Objective("goodput", "maximize", "goodput", needs_slo=True,
              help="good requests/s under --slo"),
    Objective("capacity", "maximize", "goodput", needs_slo=True, gated=True,
              help="highest rate meeting --slo (one server per trial)"),
)}
PARETO_DEFAULT_LATENCY = "e2e_p99"


def pareto_latency(name: str) -> str | None:
    """``pareto`` or ``pareto:<latency>``: the latency metric traded against
    throughput (default e2e_p99); None for a single objective."""
    if name != "pareto" and not name.startswith("pareto:"):
        return None
    metric = name.partition(":")[2] or PARETO_DEFAULT_LATENCY
    found = OBJECTIVES.get(metric)
    if found is None or found.direction != "minimize":
        raise InputError(
            f"--objective {name}: {metric!r} is not a latency percentile",
            hint="e.g. pareto (throughput vs e2e_p99) or pareto:ttft_p99; latencies: "
            + ", ".join(k for k, v in OBJECTIVES.items() if v.direction == "minimize"),
        )
    return metric


def get_objective(name: str) -> Objective:
    """The registered objective ``name`` (``pareto[:LATENCY]`` built from its
    latency); an unknown name fails with the nearest ones."""
    if (latency := pareto_latency(name)) is not None:
        return Objective(name, "pareto", latency)
    if name not in OBJECTIVES:
        close = difflib.get_close_matches(name, OBJECTIVES, n=3)
        raise InputError(
            f"--objective: unknown objective {name!r}",
            hint="choose one of " + ", ".join(close or [*OBJECTIVES, "pareto"]),
        )
    return OBJECTIVES[name]


def lower_is_better(metric: str) -> bool:
    """For any metric of a summary (``metric_value``'s names): a registered
    objective's own sense, else latencies lower and throughputs higher."""
    found = OBJECTIVES.get(metric)
    if found is not None:
        return found.direction == "minimize"
    return "throughput" not in metric


def worse_by(metric: str, tuned: float, now: float) -> float:
    """How much worse ``now`` is than ``tuned`` as a share, in ``metric``'s
    own sense (negative: better).  A throughput of 0 now is infinitely
    worse; a latency of 0 tuned cannot be compared (inf)."""
    if lower_is_better(metric):
        return now / tuned - 1 if tuned > 0 else float("inf")
    return tuned / now - 1 if now > 0 else float("inf")


_SLO_METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class SLO:
    metric: str  # e.g. "ttft_p99" or "throughput"
    op: str  # "<=" or ">="
    limit: float  # ms for latencies, req/s for throughput

    def violation(self, value: float | None) -> float:
        """≤ 0 when met (Optuna's constraint convention); missing → violated."""
        if value is None:
            return 1.0
        return value - self.limit if self.op == "<=" else self.limit - value

    def __str__(self) -> str:
        unit = "ms" if self.metric != "throughput" else "req/s"
        return f"{self.metric}{self.op}{self.limit:g}{unit}"


def parse_slo(text: str | None) -> list[SLO]:
    """``ttft_p99<=500ms,tpot_p99<=50ms,e2e_p99<=3s,throughput>=2``."""
    if not text:
        return []
    out = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(
            r"(?P<metric>[a-z_0-9]+)\s*(?P<op><=|>=|<|>)\s*"
            r"(?P<num>[0-9]*\.?[0-9]+)\s*(?P<unit>ms|s|req/s|rps)?",
            part,
        )
        if not m:
            raise InputError(
                f"--slo: cannot read {part!r}",
                hint="write e.g. --slo 'ttft_p99<=500ms,tpot_p99<=50ms,e2e_p99<=3s'",
            )
        metric = m["metric"]
        op = "<=" if "<" in m["op"] else ">="
        value = float(m["num"])
        if metric == "throughput":
            if op != ">=":
                raise InputError("--slo: throughput takes >=", hint="throughput>=5")
        else:
            base, _, pct = metric.rpartition("_")
            if base not in _SLO_METRICS or pct not in ("p50", "p90", "p99", "mean"):
                raise InputError(
                    f"--slo: unknown metric {metric!r}",
                    hint="use ttft|tpot|itl|e2e with _p50/_p90/_p99/_mean, or "
                    "throughput",
                )
            if op != "<=":
                raise InputError(f"--slo: {metric} takes <=", hint=f"{metric}<=500ms")
            if m["unit"] == "s":
                value *= 1000.0
            elif m["unit"] not in (None, "ms"):
                raise InputError(f"--slo: {metric} is a time", hint="use ms or s")
        out.append(SLO(metric, op, value))
    return out
