"""One measurement of a server qtune launches: start → ready → warm-up and
measured load → stop (``measure_server``), the same for a search trial, the
top-K confirmation and ``qtune verify``; ``measure_load`` is its middle part,
for a server already up (the ``--levels`` points of a trial); ``interleaved``
is the order in which repeated measurements of several configs run.

The result is a ``Measurement``: the run summary of ``qtune.bench.measure``
with its fixed fields typed, and when and how long it ran kept beside it, not
in it.  ``to_dict()`` gives the summary exactly as it is stored in a study
and printed by ``--json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from qtune import seeds
from qtune.bench import BenchConfig, measure
from qtune.capacity import CapacityPlan, CapacityResult, find_capacity
from qtune.engines.base import Failure
from qtune.errors import ServerError
from qtune.launch import LaunchSpec, StartPhases
from qtune.load import Watcher
from qtune.load.workload import Workload
from qtune.params import JSONObject, JSONValue
from qtune.seeds import Phase
from qtune.server import Server

T = TypeVar("T")

# The summary's keys from qtune.metrics.summarize, in their stored order.
_RUN_KEYS = ("completed", "failed", "truncated", "duration_s", "request_throughput",
             "output_token_throughput", "total_token_throughput", "input_tokens",
             "output_tokens", "errors", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
# What qtune.bench.measure adds after the load's checks (optional ones last).
_AFTER_CHECKS = ("cache_reset", "held_peak")
_OPTIONAL = ("goodput", "keeps_up", "overloaded", "server", "contaminated",
             "cache_unchecked", "client_lag_ms", "client_lagged", "capacity")


@dataclass
class Measurement:
    """One measured run of a workload on one server."""

    completed: int
    failed: int
    truncated: int
    duration_s: float
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    input_tokens: int
    output_tokens: int
    errors: dict[str, int]
    # Per latency metric: mean, p50, p90, p99 in ms (None: no sample).
    ttft_ms: dict[str, float] | None
    tpot_ms: dict[str, float] | None
    itl_ms: dict[str, float] | None
    e2e_ms: dict[str, float] | None
    warmup_requests: int
    warmup_s: float
    saturated: bool
    stopped_early: str | None  # a pruner's or the saturation check's stop
    cache_reset: Any
    held_peak: int
    # The load's own checks (usage_distrusted, prompt_length,
    # length_mismatch): only those that found something.
    checks: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, Any] | None = None  # with an SLO
    keeps_up: dict[str, Any] | None = None  # at a request rate
    overloaded: str | None = None  # how the server fell behind that rate
    server: dict[str, Any] | None = None  # the server's /metrics view
    contaminated: str | None = None  # why the phase measured cached prefills
    # why nothing shows that the phase did not (no hit rate, no reset)
    cache_unchecked: str | None = None
    # The client's own event loop's lateness in the measured phase (p99, max
    # in ms, seconds spent late), and why it was said when it was large.
    client_lag_ms: dict[str, float] | None = None
    client_lagged: str | None = None
    capacity: dict[str, Any] | None = None  # --objective capacity's search
    # When and how long: beside the summary, not part of it.
    started: str | None = None  # ISO time of the measured phase's start
    finished: str | None = None
    measure_s: float | None = None
    startup_s: float | None = None  # the server's start (measure_server only)
    # The capacity search behind ``capacity`` (its probes' whole summaries).
    capacity_result: CapacityResult | None = field(default=None, repr=False)
    # The start's phases read from the engine's log (measure_server only).
    start_phases: StartPhases | None = None

    @classmethod
    def from_summary(cls, summary: Mapping[str, JSONValue]) -> Measurement:
        """From a summary as ``qtune.bench.measure`` returns it."""
        # Its fields have the types summarize (qtune.metrics) gives them:
        # read as they are, not checked again here.
        s: Mapping[str, Any] = summary
        known = {*_RUN_KEYS, "warmup_requests", "warmup_s", "saturated",
                 "stopped_early", *_AFTER_CHECKS, *_OPTIONAL}
        return cls(
            **{k: s[k] for k in _RUN_KEYS},
            warmup_requests=s["warmup_requests"], warmup_s=s["warmup_s"],
            saturated=s["saturated"], stopped_early=s["stopped_early"],
            cache_reset=s["cache_reset"], held_peak=s["held_peak"],
            checks={k: v for k, v in s.items() if k not in known},
            **{k: s[k] for k in _OPTIONAL if k in s},
        )

    def to_dict(self) -> JSONObject:
        """The summary as stored in a study's ``summary`` attribute and as
        ``--json`` prints it: the keys in ``qtune.bench.measure``'s order,
        the optional ones only when set."""
        out = {k: getattr(self, k) for k in _RUN_KEYS}
        out.update(warmup_requests=self.warmup_requests, warmup_s=self.warmup_s,
                   saturated=self.saturated, stopped_early=self.stopped_early)
        out.update(self.checks)
        out.update({k: getattr(self, k) for k in _AFTER_CHECKS})
        out.update({k: v for k in _OPTIONAL if (v := getattr(self, k)) is not None})
        return out


def measure_load(spec: LaunchSpec, bench: BenchConfig, wl: Workload | None = None, *,
                 progress: Callable[[str], None] | None = None,
                 watch: Watcher | None = None,
                 capacity: CapacityPlan | None = None) -> Measurement:
    """Measure the ready server of ``spec``: warm-up and the measured load of
    ``wl`` (default: ``bench.workload``), with ``watch`` (a pruner) looking on;
    with a ``capacity`` plan, a capacity search on this one server instead."""
    wl = bench.workload if wl is None else wl
    started = dt.datetime.now()
    m0 = time.monotonic()
    cap: CapacityResult | None = None
    if capacity is not None:
        cap = find_capacity(spec.base_url, spec.served_model, bench, progress, capacity)
        # The summary is the run that decided: the re-measure at the capacity
        # (fresh prompts, twice the probe window), or the one probe of a
        # config below the floor; with no capacity at all, a run at the
        # study's load with prompts no probe sent.
        summary = dict(cap.summary_at_value() or measure(
            spec.base_url, spec.served_model,
            dataclasses.replace(wl, seed=seeds.seed(wl.seed, Phase.FIRST_LOAD)), bench,
            progress=progress))
        summary["capacity"] = cap.to_dict()
    else:
        summary = measure(spec.base_url, spec.served_model, wl, bench,
                          progress=progress, watch=watch)
    out = Measurement.from_summary(summary)
    out.capacity_result = cap
    out.measure_s = time.monotonic() - m0
    out.started, out.finished = started.isoformat(), dt.datetime.now().isoformat()
    return out


class ServerDied(ServerError):
    """The server died under load: its measurement cannot be trusted, but
    it was taken (``measurement``: how long it ran)."""

    def __init__(self, failure: Failure, measurement: Measurement) -> None:
        super().__init__("server died under load", reason=failure.reason,
                         detail=failure.detail)
        self.measurement = measurement


# The replay benchmark (qtune.search.replay) answers server starts from a
# measured table: the search's own code runs, only this measurement is
# replaced.  None: start the server.
_STAND_IN: ContextVar[Callable[..., Measurement] | None] = ContextVar(
    "measure_server_stand_in", default=None)


@contextlib.contextmanager
def replace_measure_server(fn: Callable[..., Measurement]) -> Iterator[None]:
    """Within the block, ``measure_server`` returns ``fn(spec, log, bench,
    **its keyword arguments)`` and starts nothing."""
    token = _STAND_IN.set(fn)
    try:
        yield
    finally:
        _STAND_IN.reset(token)


def measure_server(
    spec: LaunchSpec,
    log: Path,
    bench: BenchConfig,
    *,
    startup_timeout: float,
    classify: Callable[[str], Failure],
    progress: Callable[[str], None] | None = None,
    watch: Watcher | None = None,
    capacity: CapacityPlan | None = None,
    on_tick: Callable[[float], None] | None = None,
    on_ready: Callable[[float], None] | None = None,
    before: Callable[[], None] | None = None,
    after: Callable[[Measurement], None] | None = None,
    check_alive: bool = False,
    phases: Callable[[str, float], StartPhases] | None = None,
) -> Measurement:
    """Start the server of ``spec`` (its log to ``log``), wait until it is
    ready, measure it (``measure_load``) and stop it, on every path.

    ``on_ready`` hears the seconds to ready, ``before`` runs on the ready
    server before the measurement (``--levels``: the lower levels), ``after``
    on the still running server after it (the quality gate).  With
    ``check_alive``, a server that died under load raises ``ServerDied``
    (a failed config, not a slow one).  ``phases`` (the engine's
    ``start_phases``) reads where the start went from its log.  Raises
    ``ServerError`` when the server does not start."""
    if (stand_in := _STAND_IN.get()) is not None:
        return stand_in(spec, log, bench, startup_timeout=startup_timeout,
                        classify=classify, progress=progress, watch=watch,
                        capacity=capacity, on_tick=on_tick, on_ready=on_ready,
                        before=before, after=after, check_alive=check_alive,
                        phases=phases)
    with Server(spec, log) as server:
        ready = server.wait_ready(startup_timeout, on_tick=on_tick, classify=classify)
        if on_ready is not None:
            on_ready(ready)
        if before is not None:
            before()
        out = measure_load(spec, bench, progress=progress, watch=watch, capacity=capacity)
        out.startup_s = ready
        if phases is not None:
            out.start_phases = phases(server.log_text(), ready)
        if check_alive and (server.proc is None or server.proc.poll() is not None):
            raise ServerDied(classify(server.log_text()), out)
        if after is not None:
            after(out)
    return out


def interleaved(items: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """``(repeat, item)`` for each repeat, the order rotated by one item per
    repeat (ABC, BCA, CAB; ABBA for two), so a drift of the machine over the
    session does not favour any item."""
    n = len(items)
    if n == 0:
        return
    for rep in range(repeats):
        for item in [*items[rep % n:], *items[:rep % n]]:
            yield rep, item
