"""``qtune bench``: measure any OpenAI-compatible endpoint, launch nothing.

One measurement = warm-up + measured load (``qtune.load``) → summary
(``qtune.metrics``) with goodput against the SLO and, where the server has
``/metrics``, the server-side view.  On top of that:

- ``repeat``: N measurements (interleaved across endpoints when comparing),
  reported as medians with bootstrap 95% intervals, and for two endpoints
  the ratio of medians with its interval;
- ``find_capacity``: the highest request rate (or concurrency) at which the
  SLO holds, by doubling to a bracket then bisecting, stopping a step early
  when the server clearly saturates; the result is re-measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qtune.errors import InputError, mask_url
from qtune.load import run_load
from qtune.load.workload import Workload
from qtune.metrics import goodput, metric_value, summarize
from qtune.search.config import SLO

# Metrics reported across repeats and comparisons.
KEY_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99",
               "e2e_p50", "e2e_p99", "throughput", "output_throughput")


@dataclass
class BenchConfig:
    urls: list[str]
    workload: Workload
    model: str | None = None
    tokenizer: Path | None = None
    slo: list[SLO] = field(default_factory=list)
    repeat: int = 1
    find_capacity: bool = False
    capacity_tolerance: float = 0.1  # stop bisecting when (hi - lo) / lo below this
    capacity_steps: int = 8
    scrape_metrics: bool = True


Progress = Callable[[str], None]


def served_model(url: str) -> tuple[str, str | None]:
    """The first model ``/v1/models`` lists, and its ``root`` (vLLM gives the
    model path there, where a tokenizer may be found)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as r:
            data = json.loads(r.read())
        first = data["data"][0]
        return str(first["id"]), first.get("root")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        # The server's answer is untrusted: a name for its shape, and the
        # URL's password masked (the exception text may repeat the URL).
        raise InputError(
            f"--url {mask_url(url)}: cannot list models ({type(exc).__name__}: "
            f"{str(exc)[:200]})",
            hint="is the server up? pass --model NAME if it has no /v1/models",
        ) from None


def find_tokenizer(root: str | None) -> Path | None:
    if root and Path(root).is_dir() and (Path(root) / "tokenizer.json").is_file():
        return Path(root)
    return None


def measure(
    url: str, model: str, wl: Workload, cfg: BenchConfig, *,
    max_inflight: int | None = None, progress: Progress | None = None,
    watch: Any = None,
) -> dict[str, Any]:
    def tick(phase: str, done: int, total: int | None) -> None:
        if progress:
            progress(f"{phase} {done}/{total}" if total else f"{phase} {done}")

    res = asyncio.run(run_load(url, model, wl, tokenizer=cfg.tokenizer, progress=tick,
                               max_inflight=max_inflight,
                               scrape_metrics=cfg.scrape_metrics, watch=watch))
    s = summarize(res.samples, res.duration)
    s["warmup_requests"] = len(res.warmup)
    s["warmup_s"] = res.warmup_s
    s["saturated"] = res.saturated
    s["stopped_early"] = res.stopped
    if cfg.slo:
        s["goodput"] = goodput(res.samples, res.duration, cfg.slo, s)
    if res.server is not None:
        s["server"] = res.server
    return s


def _bootstrap_median(
    values: list[float], seed: int = 0
) -> tuple[float, float | None, float | None]:
    arr = np.asarray(values, dtype=float)
    med = float(np.median(arr))
    if arr.size < 3:
        return med, None, None
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(arr, size=(2000, arr.size), replace=True), axis=1)
    return med, float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def _ratio_ci(a: list[float], b: list[float], seed: int = 0) -> dict[str, Any]:
    """Ratio of medians b/a with a bootstrap 95% interval."""
    A, B = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratio = float(np.median(B) / np.median(A)) if np.median(A) else math.nan
    if A.size < 3 or B.size < 3:
        return {"ratio": ratio, "ci95": None}
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(A, size=(2000, A.size)), axis=1)
    mb = np.median(rng.choice(B, size=(2000, B.size)), axis=1)
    r = mb / np.where(ma == 0, np.nan, ma)
    return {"ratio": ratio, "ci95": [float(np.nanpercentile(r, 2.5)),
                                     float(np.nanpercentile(r, 97.5))]}


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    models: list[str] = []
    for url in cfg.urls:
        name, root = served_model(url) if cfg.model is None else (cfg.model, None)
        models.append(name)
        if cfg.tokenizer is None:
            cfg.tokenizer = find_tokenizer(root)
    out: dict[str, Any] = {
        # Printed, written to --json and the CSV: never a URL's password.
        "urls": [mask_url(u) for u in cfg.urls], "models": models,
        "workload": cfg.workload.to_dict(),
        "slo": [str(s) for s in cfg.slo],
        "tokenizer": str(cfg.tokenizer) if cfg.tokenizer else None,
    }
    if cfg.find_capacity:
        out["capacity"] = find_capacity(cfg.urls[0], models[0], cfg, progress)
        return out
    runs: list[list[dict[str, Any]]] = [[] for _ in cfg.urls]
    for rep in range(cfg.repeat):
        # Interleave endpoints (ABAB...) so drift spreads over both.
        for k, url in enumerate(cfg.urls):
            if progress:
                progress(f"run {rep + 1}/{cfg.repeat} on {mask_url(url)}")
            wl = dataclasses.replace(cfg.workload, seed=cfg.workload.seed + rep)
            runs[k].append(measure(url, models[k], wl, cfg, progress=progress))
    if len(cfg.urls) == 1 and cfg.repeat == 1:
        out.update(runs[0][0])
        return out
    out["runs"] = runs
    out["repeats"] = []
    for k, url in enumerate(cfg.urls):
        agg: dict[str, Any] = {"url": mask_url(url)}
        for m in KEY_METRICS:
            vals = [v for r in runs[k] if (v := metric_value(r, m)) is not None]
            if vals:
                med, lo, hi = _bootstrap_median(vals)
                agg[m] = {"median": med, "ci95": [lo, hi] if lo is not None else None,
                          "values": vals}
        out["repeats"].append(agg)
    if len(cfg.urls) == 2:
        cmp: dict[str, Any] = {}
        for m in KEY_METRICS:
            a = [v for r in runs[0] if (v := metric_value(r, m)) is not None]
            b = [v for r in runs[1] if (v := metric_value(r, m)) is not None]
            if a and b:
                cmp[m] = _ratio_ci(a, b)
        out["comparison"] = {"ratio": "second / first", **cmp}
    return out


def _meets(s: dict[str, Any], slos: list[SLO], offered: float | None) -> tuple[bool, str]:
    if s["completed"] == 0:
        return False, "no request completed"
    if s["failed"]:
        return False, f"{s['failed']} failed requests"
    if s.get("saturated"):
        return False, "saturated (requests piled up)"
    if offered is not None and s["request_throughput"] < 0.9 * offered * (
        s["completed"] / max(s["completed"] + s["failed"], 1)
    ) and s["duration_s"] > 0:
        # The measured window stretches when the server falls behind.
        achieved = s["request_throughput"]
        if achieved < 0.8 * offered:
            return False, f"served {achieved:.2f} of {offered:.2f} req/s"
    for slo in slos:
        v = metric_value(s, slo.metric)
        if slo.violation(v) > 0:
            return False, f"{slo.metric}={v:.1f} breaks {slo}"
    return True, "SLO met"


def find_capacity(
    url: str, model: str, cfg: BenchConfig, progress: Progress | None = None
) -> dict[str, Any]:
    slos = [s for s in cfg.slo if s.metric != "throughput"]
    if not slos:
        raise InputError("--find-capacity needs a latency SLO",
                         hint="e.g. --slo 'ttft_p99<=500ms,tpot_p99<=50ms'")
    wl = cfg.workload
    by_rate = wl.concurrency is None
    steps: list[dict[str, Any]] = []

    def probe_at(x: float) -> bool:
        w = (dataclasses.replace(wl, rate=x) if by_rate
             else dataclasses.replace(wl, concurrency=int(x)))
        if progress:
            progress(f"capacity: trying {'rate' if by_rate else 'concurrency'} {x:g}")
        # A backlog of many seconds of arrivals cannot recover within the run.
        cap = max(32, int(x * 10)) if by_rate else None
        s = measure(url, model, w, cfg, max_inflight=cap, progress=progress)
        ok, why = _meets(s, slos, x if by_rate else None)
        steps.append({"load": x, "ok": ok, "why": why,
                      **{m: metric_value(s, m) for m in KEY_METRICS}})
        return ok

    x = wl.rate if by_rate else float(wl.concurrency or 1)
    assert x is not None
    lo: float | None = None
    hi: float | None = None
    # Bracket: double up while the SLO holds, halve down while it does not.
    for _ in range(12):
        if probe_at(x):
            lo = x
            if hi is not None:
                break
            x = x * 2
        else:
            hi = x
            if lo is not None:
                break
            x = x / 2 if by_rate else max(1.0, math.floor(x / 2))
            if (by_rate and x < 0.01) or (not by_rate and hi == 1):
                break
    if lo is None:
        return {"found": False, "reason": f"SLO not met even at {hi:g}", "steps": steps}
    if hi is None:
        return {"found": True, "value": lo, "bracket": [lo, None],
                "note": "SLO still met at the highest load tried", "steps": steps}
    # Bisect inside the bracket.
    for _ in range(cfg.capacity_steps):
        if by_rate and (hi - lo) / lo <= cfg.capacity_tolerance:
            break
        if not by_rate and hi - lo <= 1:
            break
        mid = (lo + hi) / 2 if by_rate else float(math.floor((lo + hi) / 2))
        if probe_at(mid):
            lo = mid
        else:
            hi = mid
    # Re-measure the answer: a load that only passed once by luck is no
    # capacity.  When it fails, fall back to the next lower load that passed
    # earlier (a 5% step is smaller than a short run's noise near the knee, so
    # it can fail three times in a row), else a fifth lower (or one stream).
    last: dict[str, Any] = {}
    for _ in range(4):
        if probe_at(lo):
            last = steps[-1]
            break
        hi = lo
        passed = [st["load"] for st in steps if st["ok"] and st["load"] < lo]
        lo = max(passed) if passed else (lo * 0.8 if by_rate else max(1.0, lo - 1))
    unit = "req/s" if by_rate else "concurrency"
    if not last:
        return {"found": False, "unit": unit, "bracket": [None, hi], "steps": steps,
                "reason": f"no load held the SLO when re-measured (last tried {hi:g})"}
    return {"found": True, "unit": unit, "value": lo, "bracket": [lo, hi],
            "at_value": last, "steps": steps}
