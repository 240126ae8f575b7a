"""Summaries of a load run: percentiles, throughput, errors.  Pure.

Definitions match ``vllm bench serve`` (engines.md §5): percentiles by linear
interpolation over successful requests; TPOT = (E2E − TTFT)/(tokens − 1) for
requests with more than one output token; throughput over the measured
window.  Failed requests are counted, never averaged in.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from qtune.load.client import RequestSample

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")


def _stats(values_s: Iterable[float]) -> dict[str, float] | None:
    arr = np.fromiter(values_s, dtype=float)
    if arr.size == 0:
        return None
    ms = arr * 1000.0
    out = {"mean": float(ms.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(ms, p))
    return out


def summarize(samples: list[RequestSample], duration: float) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    errors: dict[str, int] = {}
    for s in samples:
        if s.error:
            key = s.error[:80]
            errors[key] = errors.get(key, 0) + 1
    out_tokens = sum(s.output_tokens for s in ok)
    in_tokens = sum(s.prompt_tokens for s in ok)
    summary: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(samples) - len(ok),
        "truncated": sum(1 for s in ok if s.truncated),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_token_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration
        if duration > 0
        else 0.0,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "errors": errors,
        "ttft_ms": _stats(s.ttft for s in ok if s.ttft is not None),
        "tpot_ms": _stats(t for s in ok if (t := s.tpot) is not None),
        "itl_ms": _stats(x for s in ok for x in s.itl),
        "e2e_ms": _stats(s.e2e for s in ok if s.e2e is not None),
    }
    return summary


def metric_value(summary: dict[str, Any], name: str) -> float | None:
    """Look up ``ttft_p99`` / ``e2e_p50`` / ``throughput`` in a summary."""
    if name == "throughput":
        return float(summary["request_throughput"])
    if name == "output_throughput":
        return float(summary["output_token_throughput"])
    if name == "goodput":  # good requests/s under the run's SLO
        g = summary.get("goodput")
        return None if not g else float(g["request_goodput"])
    base, _, pct = name.rpartition("_")
    stats = summary.get(f"{base}_ms")
    if not stats or pct not in stats:
        return None
    return float(stats[pct])


def spec_acceptance(drafts: float, draft_tokens: float,
                    accepted: float) -> dict[str, Any] | None:
    """Speculative decoding over a phase, from the engine's counter deltas,
    with vLLM's own definitions (``vllm/v1/spec_decode/metrics.py``): the
    acceptance rate is accepted draft tokens over proposed ones; the mean
    acceptance length counts the token the verifying step adds itself, so
    it is the tokens one step yields when a draft was proposed.  None when
    nothing was drafted (speculative decoding off, or never a match)."""
    if drafts <= 0 or draft_tokens <= 0:
        return None
    return {"drafts": int(drafts), "draft_tokens": int(draft_tokens),
            "accepted_tokens": int(accepted),
            "acceptance_rate": accepted / draft_tokens,
            "mean_acceptance_length": 1 + accepted / drafts}


# Per-request limits checkable on one request (vLLM's --goodput keys).
_PER_REQUEST = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e"}


def goodput(
    samples: list[RequestSample], duration: float, slos: list[Any],
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Share of requests meeting every per-request limit, request goodput
    (good requests per second) and whether the run met the percentile SLOs.

    ``ttft_p99<=200ms`` gives the per-request limit ttft ≤ 200 ms, as
    ``vllm bench serve --goodput ttft:200`` does; ITL and throughput SLOs are
    run-level only.  A failed request is never good.
    """
    limits: dict[str, float] = {}
    for slo in slos:
        base = slo.metric.rpartition("_")[0]
        if base in _PER_REQUEST and slo.op == "<=":
            limits[base] = min(limits.get(base, float("inf")), slo.limit / 1000.0)

    def good(s: RequestSample) -> bool:
        if not s.ok:
            return False
        for base, lim in limits.items():
            v = s.ttft if base == "ttft" else s.e2e if base == "e2e" else s.tpot
            if base == "tpot" and v is None:
                v = 0.0  # one output token: no decode time (vLLM's convention)
            if v is None or v > lim:
                return False
        return True

    n_good = sum(1 for s in samples if good(s))
    summary = summary if summary is not None else summarize(samples, duration)
    checks = {}
    for slo in slos:
        v = metric_value(summary, slo.metric)
        checks[str(slo)] = {"value": v, "met": slo.violation(v) <= 0}
    return {
        "per_request_limits_ms": {k: v * 1000.0 for k, v in limits.items()},
        "good_requests": n_good,
        "good_share": n_good / len(samples) if samples else 0.0,
        "request_goodput": n_good / duration if duration > 0 else 0.0,
        "slo_met": all(c["met"] for c in checks.values()),
        "checks": checks,
    }


def percentile_exceeds_for_sure(
    done: list[float], inflight_lower: list[float], total: int, pct: float,
    threshold: float,
) -> bool:
    """Will the ``pct`` percentile (linear interpolation, as ``summarize``)
    over ``total`` requests exceed ``threshold`` whatever the rest measure?

    With values sorted v_0..v_{N-1}, the percentile is at least v_k with
    k = floor(pct/100 · (N-1)).  If N-k values are already known to exceed the
    threshold (finished ones, and in-flight ones whose elapsed time already
    does), v_k does too.  Exact, so pruning on it never drops a trial that
    could still have won.
    """
    if total < 1:
        return False
    k = int(pct / 100.0 * (total - 1))
    above = sum(1 for v in done if v > threshold) + sum(
        1 for v in inflight_lower if v > threshold)
    return above >= total - k


@dataclass(frozen=True)
class Bound:
    """A latency percentile a run must stay within: ``metric`` (ttft, e2e or
    tpot) at percentile ``pct`` no more than ``limit_ms``; ``why`` names what
    it guards (an SLO, or the best so far)."""

    metric: str
    pct: float
    limit_ms: float
    why: str


def slo_bounds(slos: Iterable[Any]) -> list[Bound]:
    """The per-request latency percentiles among ``slos`` that a run can be
    known to break before it ends (``certain_failure``): ttft, e2e and tpot
    percentiles (an ITL percentile is not bounded while a request runs)."""
    out = []
    for slo in slos:
        b, _, p = slo.metric.rpartition("_")
        if slo.op == "<=" and p.startswith("p") and b in ("ttft", "e2e", "tpot"):
            out.append(Bound(b, float(p[1:]), slo.limit, f"breaks SLO {slo}"))
    return out


Watcher = Callable[[list[RequestSample], list[RequestSample], float], "str | None"]


def certain_failure(bounds: list[Bound], planned: int) -> Watcher:
    """A watcher (``qtune.load.run_load``'s ``watch``) that stops a run as
    soon as its verdict is certain: a request failed, or enough of the
    ``planned`` requests already exceed a bound's limit (finished ones, and
    in-flight ones by their elapsed time) that the percentile breaks it
    whatever the rest measure (``percentile_exceeds_for_sure``, exact).  It
    never stops a run that could still pass.  The search's pruner and the
    capacity probes share it."""

    def watch(done: list[RequestSample], inflight: list[RequestSample],
              now: float) -> str | None:
        bad = next((s for s in done if not s.ok), None)
        if bad is not None:
            return f"a request failed ({bad.error})"
        if planned < 1:
            return None
        for b in bounds:
            if b.metric == "ttft":
                vals = [s.ttft for s in done if s.ttft is not None]
                lower = [s.ttft if s.ttft is not None else now - s.start for s in inflight]
            elif b.metric == "e2e":
                vals = [s.e2e for s in done if s.e2e is not None]
                lower = [now - s.start for s in inflight]
            else:  # tpot: known only once a request ends
                vals = [t for s in done if (t := s.tpot) is not None]
                lower = []
            if percentile_exceeds_for_sure(vals, lower, planned, b.pct, b.limit_ms / 1000.0):
                over = sum(1 for v in [*vals, *lower] if v > b.limit_ms / 1000.0)
                return (f"{b.why}: {over} of {planned} requests already took longer than "
                        f"{b.limit_ms:.1f} ms, enough to fix its p{b.pct:g}")
        return None

    return watch


def in_flight_at_sends(samples: list[RequestSample]) -> list[tuple[float, int]]:
    """(send time, requests in flight just after it) for every request, from
    the client's own timestamps: the server holds these (running or
    waiting), so no scrape of the server is needed to see its queue grow."""
    ends = sorted(s.start + s.e2e if s.e2e is not None else math.inf for s in samples)
    starts = sorted(s.start for s in samples)
    out = []
    for i, t in enumerate(starts):
        out.append((t, i + 1 - bisect.bisect_right(ends, t)))
    return out


# What a run that did not keep up with its rate (qtune.bench.falls_behind)
# means for its latency figures, said beside them.
OVERLOAD_MEANS = ("its latencies are a growing queue's, set by the run's length as much "
                  "as by the config (--objective capacity finds the rate a config holds)")


def overload_text(why: str) -> str:
    """The line said beside the figures of a run (or runs) that fell behind."""
    return f"overloaded: {why}: {OVERLOAD_MEANS}"


def keeps_up(samples: list[RequestSample], offered: float) -> dict[str, Any]:
    """Did the server keep up with ``offered`` req/s over the arrival window?

    Three figures, each an overload's signature (an overload of ε makes the
    backlog grow by ε·rate·t, so it shows in all three over a long enough run):

    - ``served_share``: completions per second over the last two thirds of the
      arrival window (the first third fills the pipeline) against the offered
      rate; an overloaded server completes at its own rate, not the offered.
    - ``held_growth``: the time a request spends in the server, requests sent
      in the last third of the window over those sent in the middle third
      (the W of Little's law, read per request served); a queue that grows
      reads > 1.  ``held_growth_per_send`` reads the same W the other way
      round: mean requests in flight at a third's sends over its sends.  Not
      the requests in flight alone: those rise with the sends, and a Poisson
      schedule sends more in one third than in another (on one H100, runs
      25-26, every "queue growing" verdict read from the requests in flight
      came from a window that sent 14-26% more in its last third, down to
      16 req/s where the capacity was 17-20; 4 of those 5 held when measured
      again).  Each reading has noise of its own: per send the count's,
      per request the mix of request lengths.  On simulated stable servers
      (benchmarks/held_growth_noise.py, 400 windows at 10 req/s) per send
      read past 1.3x in 0-1.2% of windows, per request 0% with fixed output
      lengths and 4.5% with a lognormal mix; both at once in none, while a
      1.3x FIFO overload showed in both in 87% of windows (per send 88%).
      ``held_mid``, ``held_last`` (the requests in flight) and ``sent_mid``,
      ``sent_last`` (the sends) are the figures said beside them.
    - ``ttft_growth``: median TTFT of the requests sent in the last third
      over the middle third.
    """
    ok = [s for s in samples if s.ok and s.e2e is not None]
    if len(samples) < 9 or not ok:
        return {"served_share": None, "held_growth": None, "ttft_growth": None,
                "window_s": None}
    sends = sorted(s.start for s in samples)
    t0, t1 = sends[0], sends[-1]
    w = t1 - t0
    if w <= 0:
        return {"served_share": None, "held_growth": None, "ttft_growth": None,
                "window_s": w}
    a, b = t0 + w / 3, t0 + 2 * w / 3
    done = sum(1 for s in ok if s.e2e is not None and a <= s.start + s.e2e <= t1)
    held = in_flight_at_sends(samples)
    mid = [n for t, n in held if a <= t < b]
    last = [n for t, n in held if t >= b]
    # (served requests only: a failed one's time is unknown, and any failure
    # fails a capacity probe on its own)
    w_mid = [s.e2e for s in ok if s.e2e is not None and a <= s.start < b]
    w_last = [s.e2e for s in ok if s.e2e is not None and s.start >= b]
    tt_mid = [s.ttft for s in ok if s.ttft is not None and a <= s.start < b]
    tt_last = [s.ttft for s in ok if s.ttft is not None and s.start >= b]

    def growth(x: list[float] | list[int], y: list[float] | list[int],
               f: Callable[[Any], float]) -> float | None:
        if not x or not y or f(x) <= 0:
            return None
        return float(f(y) / f(x))

    return {
        "window_s": w,
        "served_share": done / (w * 2 / 3) / offered,
        "held_growth": growth(w_mid, w_last, lambda v: float(np.mean(v))),
        # (one in-flight figure per send: a third's count is its sends)
        "held_growth_per_send": growth(mid, last, lambda v: float(np.mean(v)) / len(v)),
        "held_mid": float(np.mean(mid)) if mid else None,
        "held_last": float(np.mean(last)) if last else None,
        "sent_mid": len(mid),
        "sent_last": len(last),
        "ttft_growth": growth(tt_mid, tt_last, lambda v: float(np.median(v))),
    }
