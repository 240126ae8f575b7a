"""Summaries of a load run: percentiles, throughput, errors.  Pure.

Definitions match ``vllm bench serve`` (engines.md §5): percentiles by linear
interpolation over successful requests; TPOT = (E2E − TTFT)/(tokens − 1) for
requests with more than one output token; throughput over the measured
window.  Failed requests are counted, never averaged in.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    base, _, pct = name.rpartition("_")
    stats = summary.get(f"{base}_ms")
    if not stats or pct not in stats:
        return None
    return float(stats[pct])
