"""``qtune bench``: measure any OpenAI-compatible endpoint, launch nothing.

One measurement = warm-up + measured load (``qtune.load``) → summary
(``qtune.metrics``) with goodput against the SLO and, where the server has
``/metrics``, the server-side view.  On top of that:

- ``repeat``: N measurements (interleaved across endpoints when comparing),
  reported as medians with bootstrap 95% intervals, and for two endpoints
  the ratio of medians with its interval;
- ``--find-capacity``: the highest request rate (or concurrency) at which
  the SLO holds (``qtune.capacity``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from qtune import seeds
from qtune.engines import any_engine_cache_reset_paths, any_engine_metric_names
from qtune.errors import InputError, UnreachableError, mask_url, printable
from qtune.launch import IGNORE_EOS, MetricNames
from qtune.load import LAG_NOTED_MS, Watcher, run_load
from qtune.load.http import request_json
from qtune.load.prompts import ServerTokenizer
from qtune.load.workload import Workload
from qtune.metrics import goodput, in_flight_at_sends, keeps_up, metric_value, summarize
from qtune.objectives import SLO
from qtune.params import JSONObject, JSONValue
from qtune.seeds import Phase
from qtune.stats import bootstrap_median, ratio_ci

# Metrics reported across repeats and comparisons.
KEY_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99",
               "e2e_p50", "e2e_p99", "throughput", "output_throughput")


@dataclass
class BenchConfig:
    urls: list[str]
    workload: Workload
    model: str | None = None
    tokenizer: Path | ServerTokenizer | None = None
    slo: list[SLO] = field(default_factory=list)
    repeat: int = 1
    find_capacity: bool = False
    capacity_tolerance: float = 0.1  # stop bisecting when (hi - lo) / lo below this
    capacity_steps: int = 8
    # Shortest arrival window of a capacity probe, in seconds; the probe
    # runs at least 10 service times too (see ``probe_requests``).
    capacity_window: float = 20.0
    scrape_metrics: bool = True
    # Gauges (running, waiting, KV use) read during the measured phase every
    # this many seconds over a connection of their own; None: counters only,
    # before and after.
    gauge_interval: float | None = field(default_factory=lambda: default_gauge_interval())
    # Empty the server's prefix cache before each measured phase (where the
    # engine offers it): on by default for the servers qtune launches (search,
    # verify); `qtune bench` asks first (--reset-prefix-cache), since it
    # changes a server qtune does not own.  Fresh prompts and the hit-rate
    # check guard the phase either way.
    reset_cache: bool = True
    # The engine's side of the measurement, from its adapter (search and
    # verify pass their engine's); for an endpoint qtune did not launch, what
    # the registered engines offer.
    metric_names: MetricNames | None = field(default_factory=any_engine_metric_names)
    reset_paths: tuple[str, ...] = field(default_factory=any_engine_cache_reset_paths)
    # What every request carries for a fixed output length (the engine's).
    request_fields: Mapping[str, Any] = field(default_factory=lambda: dict(IGNORE_EOS))


Progress = Callable[[str], None]

# Reading the gauges during a run costs the server CPU.  On the 2-core CPU
# target (benchmarks/server_view_ab.py, 3 interleaved runs each, Poisson 5
# req/s): TTFT p99 medians 103 ms with counters only, 183 ms with a read
# every 5 s, 632 ms every second (688/623/632: every run), against 144 ms
# for vLLM's own client.  On the 16-core H200 host a read every second moved
# nothing measurable (shared/reference/measured.md).  So the gauges are read
# only where spare cores make it free.
GAUGE_MIN_CPUS = 8
GAUGE_INTERVAL_S = 5.0


def default_gauge_interval() -> float | None:
    return GAUGE_INTERVAL_S if (os.cpu_count() or 1) >= GAUGE_MIN_CPUS else None


def check_url(url: str, flag: str = "--url") -> str:
    """An http(s) URL with a host and a valid port; refused with the URL's
    password masked."""
    from urllib.parse import urlsplit

    shown = printable(mask_url(url))
    hint = "e.g. http://127.0.0.1:8000 (the server's base URL)"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for "80x" or 99999
    except ValueError as exc:
        why = "bad port" if "port" in str(exc).lower() else "cannot parse it"
        raise InputError(f"{flag} {shown}: {why}", hint=hint) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"{flag} {shown}: not an http(s) URL with a host", hint=hint)
    if port == 0:
        raise InputError(f"{flag} {shown}: bad port", hint=hint)
    if printable(url) != url:
        raise InputError(f"{flag} {shown}: holds control characters", hint=hint)
    return url


def served_model(url: str, hint: str = "is the server up? pass --model NAME if it has "
                 "no /v1/models") -> tuple[str, str | None]:
    """The first model ``/v1/models`` lists, and its ``root`` (vLLM gives the
    model path there, where a tokenizer may be found).  A server that does
    not answer at all raises ``UnreachableError``; one that answers without
    a model list, ``InputError`` with ``hint`` (the caller's options)."""
    try:
        data = request_json(url.rstrip("/") + "/v1/models")
        first = data["data"][0]
        return str(first["id"]), first.get("root")
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        if not isinstance(exc, urllib.error.HTTPError):  # an HTTP status is an answer
            why = getattr(exc, "reason", exc)
            raise UnreachableError(
                f"--url {mask_url(url)}: cannot list models: no answer ({type(why).__name__}: "
                f"{str(why)[:200]})",
                hint="start the server, or check the host and port") from None
        raise InputError(f"--url {mask_url(url)}: cannot list models (HTTP "
                         f"{exc.code})", hint=hint) from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        # The server's answer is untrusted: a name for its shape, and the
        # URL's password masked (the exception text may repeat the URL).
        raise InputError(
            f"--url {mask_url(url)}: cannot list models ({type(exc).__name__}: "
            f"{str(exc)[:200]})",
            hint=hint,
        ) from None


def served_root(url: str, name: str) -> str | None:
    """The ``root`` that ``/v1/models`` gives for ``name``; None when the
    server lists no models, or not this one (best effort: ``--model`` was
    given, so the listing is not needed for the name)."""
    try:
        data = request_json(url.rstrip("/") + "/v1/models")
        for m in data["data"]:
            if isinstance(m, dict) and m.get("id") == name and isinstance(
                m.get("root"), str
            ):
                return str(m["root"])
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        pass
    return None


def find_tokenizer(root: str | None) -> Path | None:
    """``root`` when it is a local folder holding a ``tokenizer.json``."""
    if not root:
        return None
    try:
        p = Path(root).expanduser()
        if p.is_dir() and (p / "tokenizer.json").is_file():
            return p
    except (OSError, ValueError):  # a served name that is no path at all
        pass
    return None


def prompt_tokenizer(
    url: str, model: str, candidates: list[str | None]
) -> tuple[Path | ServerTokenizer | None, str | None]:
    """The served model's tokenizer for exact prompt lengths, and a warning
    when there is none: a local folder among ``candidates`` (``--model``, the
    served model's ``root``) with a ``tokenizer.json``, else the server's
    ``/tokenize``.  Without either, prompts are words: 3.4 tokens each in a
    BPE vocabulary (678 tokens sent for ``--input-len 200`` on the CPU target)."""
    for c in candidates:
        if (found := find_tokenizer(c)) is not None:
            return found, None
    tok, why = ServerTokenizer.connect(url, model)
    if tok is not None:
        return tok, None
    return None, (f"no tokenizer for exact prompt lengths ({why}; no local folder "
                  "with tokenizer.json): prompts are N common words, not N tokens")


# Above this prefix-cache hit rate, a phase whose prompts share no prefix
# found something an earlier phase left: its figures are for a cheaper
# workload than the one asked for (the H200 capacity probes that reused their
# prompts ran at a 0.984 hit rate and read 1.5x the real capacity).
CONTAMINATED_HIT_RATE = 0.05


def measure(
    url: str, model: str, wl: Workload, cfg: BenchConfig, *,
    max_inflight: int | None = None, progress: Progress | None = None,
    watch: Watcher | None = None, wait_idle: bool = False,
) -> JSONObject:
    def tick(phase: str, done: int, total: int | None) -> None:
        if progress:
            progress(f"{phase} {done}/{total}" if total else f"{phase} {done}")

    fresh = wl.prefix_count == 0 and wl.dataset is None
    res = asyncio.run(run_load(url, model, wl, tokenizer=cfg.tokenizer, progress=tick,
                               max_inflight=max_inflight,
                               scrape_metrics=cfg.scrape_metrics, watch=watch,
                               gauge_interval=cfg.gauge_interval,
                               reset_cache=fresh and cfg.reset_cache,
                               metric_names=cfg.metric_names, reset_paths=cfg.reset_paths,
                               request_fields=cfg.request_fields,
                               wait_idle=wait_idle and cfg.scrape_metrics))
    s = summarize(res.samples, res.duration)
    s["warmup_requests"] = len(res.warmup)
    s["warmup_s"] = res.warmup_s
    s["saturated"] = res.saturated
    s["stopped_early"] = res.stopped
    s.update(res.checks)  # usage_distrusted, prompt_length, length_mismatch
    s["cache_reset"] = res.cache_reset
    if res.idle_wait_s:
        s["idle_wait_s"] = round(res.idle_wait_s, 3)
    s["held_peak"] = max((n for _, n in in_flight_at_sends(res.samples)), default=0)
    if cfg.slo:
        s["goodput"] = goodput(res.samples, res.duration, cfg.slo, s)
    if wl.rate is not None:
        s["keeps_up"] = keeps_up(res.samples, wl.rate)
        # a latency study at a rate the server cannot serve measures a queue:
        # said beside the figures (H200, SGLang, 40 req/s offered: both the
        # defaults and the winner served ~26 and their E2E p99 was the
        # backlog of an 800-request run)
        if (behind := falls_behind(s, wl.rate)) is not None:
            s["overloaded"] = behind
    hit = None
    if res.server is not None:
        s["server"] = res.server
        hit = res.server.get("prefix_cache_hit_rate")
        if fresh and hit is not None and hit > CONTAMINATED_HIT_RATE:
            s["contaminated"] = (f"prefix-cache hit rate {hit:.0%} on prompts the server "
                                 "had not been sent: the phase measured cached prefills")
    if (lag := res.client_lag) is not None:
        s["client_lag_ms"] = lag
        if lag["max"] > LAG_NOTED_MS:
            s["client_lagged"] = client_lag_text(lag)
    if fresh and hit is None and not res.cache_reset:
        # Said, not assumed: the prompts are fresh, but nothing shows that
        # the phase did not reuse what an earlier one left in the cache.
        names = cfg.metric_names
        why = ("the engine reports no prefix-cache counters"
               if names is None or names.prefix_cache_hits is None
               else "no prefix-cache hit rate was read from the server")
        s["cache_unchecked"] = (f"{why} and its cache was not emptied: fresh prompts, "
                                "but no hit rate shows the phase measured no cached prefill")
    return s


def client_lag_text(lag: Mapping[str, float]) -> str:
    """What a late client loop means for the figures beside it."""
    return (f"the measuring client's loop ran up to {lag['max']:,.0f} ms late "
            f"({lag['late_s']:g} s in all), waiting for a core the server kept busy: "
            "latencies read then are late by as much")


def endpoint_header(cfg: BenchConfig) -> tuple[JSONObject, list[str]]:
    """What ``qtune bench`` reports before measuring: the endpoints (masked),
    their served models, the workload and SLO; fills ``cfg.tokenizer`` once,
    before any phase (never a /tokenize during one)."""
    models: list[str] = []
    roots: list[str | None] = []
    for url in cfg.urls:
        # With --model the name is known, but the root is still worth
        # asking for: the served model's folder holds its tokenizer.
        name, root = (served_model(url) if cfg.model is None
                      else (cfg.model, served_root(url, cfg.model)))
        models.append(name)
        roots.append(root)
    tokenizer_warning = None
    if cfg.tokenizer is None:
        # Built here, once, before any phase: never a /tokenize during one.
        cfg.tokenizer, tokenizer_warning = prompt_tokenizer(
            cfg.urls[0], models[0], [cfg.model, *roots])
    out: JSONObject = {
        # Printed, written to --json and the CSV: never a URL's password.
        "urls": [mask_url(u) for u in cfg.urls], "models": models,
        "workload": cfg.workload.to_dict(),
        "slo": [str(s) for s in cfg.slo],
        "tokenizer": str(cfg.tokenizer) if cfg.tokenizer else None,
    }
    if tokenizer_warning:
        out["tokenizer_warning"] = tokenizer_warning
    return out, models


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> JSONObject:
    """Measure each endpoint ``cfg.repeat`` times, interleaved, with medians
    and intervals when repeated and a ratio when two are compared (a
    capacity search is ``qtune.capacity.run_capacity``)."""
    out, models = endpoint_header(cfg)
    runs: list[list[JSONObject]] = [[] for _ in cfg.urls]
    for rep in range(cfg.repeat):
        # Interleave endpoints (ABAB...) so drift spreads over both.
        for k, url in enumerate(cfg.urls):
            if progress:
                progress(f"run {rep + 1}/{cfg.repeat} on {mask_url(url)}")
            wl = dataclasses.replace(cfg.workload,
                                     seed=seeds.seed(cfg.workload.seed, Phase.RUN, rep))
            runs[k].append(measure(url, models[k], wl, cfg, progress=progress))
    if len(cfg.urls) == 1 and cfg.repeat == 1:
        out.update(runs[0][0])
        return out
    out["runs"] = runs
    repeats: list[JSONObject] = []
    out["repeats"] = repeats
    for k, url in enumerate(cfg.urls):
        agg: JSONObject = {"url": mask_url(url)}
        for m in KEY_METRICS:
            vals = [v for r in runs[k] if (v := metric_value(r, m)) is not None]
            if vals:
                med, lo, hi = bootstrap_median(vals)
                agg[m] = {"median": med, "ci95": [lo, hi] if lo is not None else None,
                          "values": vals}
        repeats.append(agg)
    if len(cfg.urls) == 2:
        cmp: JSONObject = {}
        for m in KEY_METRICS:
            a = [v for r in runs[0] if (v := metric_value(r, m)) is not None]
            b = [v for r in runs[1] if (v := metric_value(r, m)) is not None]
            if a and b:
                cmp[m] = ratio_ci(a, b)
        out["comparison"] = {"ratio": "second / first", **cmp}
    return out


# A load holds only if the server kept up over the run (qtune.metrics.keeps_up):
# completions over the window's last two thirds at least this share of the
# offered rate (less a Poisson allowance of 2.5 standard deviations on short
# windows), and no queue growing from the middle third to the last: the time
# in the server up by more than this factor read both ways (per request
# served, and requests in flight per request sent: qtune.metrics.keeps_up
# says why both) while the requests in flight rise by at least this many.  An
# overload of 10% grows the backlog by 0.1 x rate x window: over a
# 10-service-time window, by at least a third of what a stable server holds.
SERVED_MIN = 0.9
HELD_GROWTH_MAX = 1.3
HELD_GROWTH_MIN_REQUESTS = 2.0
# TTFT of the last third against the middle third: a queue in front of the
# engine shows here first when the batch is full.
TTFT_GROWTH_MAX = 2.0
TTFT_GROWTH_MIN_MS = 100.0

def falls_behind(s: Mapping[str, JSONValue], offered: float | None) -> str | None:
    """Why the server did not keep up with ``offered`` req/s over the run
    (qtune.metrics.keeps_up's figures against the limits above), or None.
    Past that point a latency is a queue's: it grows with the run's length,
    whatever the config."""
    # keeps_up's figures and a latency's percentiles are numbers
    # (qtune.metrics.keeps_up, summarize)
    k = cast("Mapping[str, float]", s.get("keeps_up") or {})
    if offered is None or k.get("served_share") is None:
        return None
    expected = offered * k["window_s"] * 2 / 3
    slack = max(1 - SERVED_MIN, 2.5 / math.sqrt(max(expected, 1.0)))
    if k["served_share"] < 1 - slack:
        return (f"served {k['served_share'] * offered:.2f} of {offered:.2f} "
                "req/s over the arrival window")
    g = k.get("held_growth")
    gs = k.get("held_growth_per_send")
    if g is not None and g > HELD_GROWTH_MAX and (gs is None or gs > HELD_GROWTH_MAX) and \
            k["held_last"] - k["held_mid"] >= HELD_GROWTH_MIN_REQUESTS:
        sent = (f", the time in the server {g:.2f}x per request served and {gs:.2f}x per "
                f"request sent ({k['sent_mid']:.0f} -> {k['sent_last']:.0f} sends)"
                if gs is not None else f", {g:.2f}x the time in the server")
        return (f"queue growing: {k['held_mid']:.1f} -> {k['held_last']:.1f} "
                f"requests in flight from the middle to the last third{sent}")
    tg = k.get("ttft_growth")
    tt = cast("Mapping[str, float]", s.get("ttft_ms") or {}).get("p50")
    if tg is not None and tt is not None and tg > TTFT_GROWTH_MAX and \
            tt * (tg - 1) >= TTFT_GROWTH_MIN_MS:
        return f"TTFT trending up: {tg:.1f}x from the middle to the last third"
    return None
