"""``qtune check PROFILE --url URL``: is a running server still what was
tuned?  It launches nothing.

1. **Config**: the engine version and launch parameters the server reports
   (its adapter's ``report_paths`` and ``running_config``: for vLLM its
   ``/version``, the ``cache_config_info`` gauge on ``/metrics``, and the
   whole config on ``/server_info`` where development mode offers it), each
   against the profile.  A parameter the server does not report is listed as
   not checked, never assumed equal.
2. **Speed**, only when the config matches: the profile's workload with
   fresh prompts (a seed the search never used), measured as ``qtune bench``
   measures, against the figure the profile was chosen on.  The noise band
   is the larger of the spread of the winner's own confirmation runs and the
   run-to-run agreement of one measurement (p50 10%, p99 25%, throughput 5%:
   the bounds within which qtune and vLLM's client agree on one server,
   ``benchmarks/server_view_ab.py``).  A capacity profile is checked at its
   capacity: does the SLO still hold and the server keep up?

Exit codes for a cron job or a CI gate: 0 as tuned, 4 slower than tuned
(outside the noise), 5 not the tuned config, 6 the server does not answer;
1 bad input (2 a usage error), as everywhere.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable
from typing import NotRequired, TypedDict

from qtune import seeds
from qtune.bench import (
    BenchConfig,
    check_url,
    measure,
    prompt_tokenizer,
    served_model,
)
from qtune.capacity import judge_load
from qtune.engines import ENGINES
from qtune.errors import InputError, mask_url
from qtune.launch import RunningConfig
from qtune.load.http import request_bytes
from qtune.load.workload import Workload
from qtune.metrics import metric_value
from qtune.objectives import Objective, get_objective, parse_slo, worse_by
from qtune.params import JSONObject
from qtune.profile import Profile
from qtune.seeds import Phase

AS_TUNED, SLOWER, NOT_TUNED = 0, 4, 5
# One measurement's agreement with another of the same server (see above).
NOISE = {"p50": 0.10, "p90": 0.25, "p99": 0.25, "mean": 0.10}
THROUGHPUT_NOISE = 0.05
GOODPUT_NOISE = 0.10
REPORT_BYTES = 4 << 20  # a /metrics page of a busy DP server is ~1 MB


def _get(url: str) -> str | None:
    try:
        return request_bytes(url, limit=REPORT_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):  # HTTPError is an OSError
        return None


def _norm(v: object) -> str:
    """Launch values compare by meaning: 0.9 == "0.9", 8 == 8.0, True ==
    "true"."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        f = float(v)
        return str(int(f)) if f.is_integer() else repr(round(f, 6))
    s = str(v).strip()
    try:
        return _norm(float(s))
    except ValueError:
        return {"True": "true", "False": "false"}.get(s, s.lower())


class Difference(TypedDict):
    """A setting the server runs otherwise than the profile says."""

    what: str  # the setting: "served model", "engine version", a parameter
    tuned: object  # the profile's value
    running: object  # the server's, as it reports it
    source: str  # where the server reported it ("/version", ...)


class ConfigCheck(TypedDict):
    """``compare_config``: the check's ``config`` part of ``--json``."""

    differ: list[Difference]
    checked: list[str]  # the settings the server reports
    not_checked: list[str]  # the profile's settings it does not


class CheckResult(TypedDict):
    """What ``qtune check`` found, as ``--json`` prints it (the keys in this
    order, the NotRequired ones only where they apply)."""

    profile: str
    url: str  # its password masked
    served: str  # the model the server lists
    engine_version: str | None  # as the server reports it
    config: ConfigCheck
    runs: NotRequired[list[JSONObject]]  # each run's main figures
    tokenizer_warning: NotRequired[str]
    at: NotRequired[str | None]  # a capacity profile: the load checked
    judged: NotRequired[list[str]]  # ... and each run's verdict there
    compare: NotRequired[JSONObject]  # the objective's own metric
    compared: NotRequired[list[JSONObject]]  # every judged metric
    # Set last, on every return (after the figures they judge).
    verdict: NotRequired[str]
    exit_code: NotRequired[int]  # AS_TUNED, SLOWER or NOT_TUNED
    warnings: NotRequired[list[str]]  # the CLI's: how this host differs


def compare_config(profile: Profile, running: RunningConfig,
                   served: str) -> ConfigCheck:
    """Which of the profile's settings the server reports, and which differ."""
    differ: list[Difference] = []
    checked: list[str] = []
    tuned = {**profile.params, **{k: v for k, v in profile.env.items()
                                  if k in running.params}}
    want_name = profile.model.get("served_name") or profile.model.get("id")
    if want_name and served != want_name:
        differ.append({"what": "served model", "tuned": want_name, "running": served,
                       "source": "/v1/models"})
    if running.version is not None:
        checked.append("engine version")
        if running.version.split("+")[0] != profile.engine.version.split("+")[0]:
            differ.append({"what": "engine version", "tuned": profile.engine.version,
                           "running": running.version, "source": "/version"})
    for name, value in sorted(tuned.items()):
        if name not in running.params:
            continue
        checked.append(name)
        if _norm(value) != _norm(running.params[name]):
            differ.append({"what": name, "tuned": value, "running": running.params[name],
                           "source": running.sources.get(name, "")})
    not_checked = sorted(k for k in tuned if k not in running.params)
    return {"differ": differ, "checked": checked, "not_checked": not_checked}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One judged metric: the profile's value against the server's now."""

    metric: str
    tuned: float
    now: float
    noise: float  # the band, as a share, within which "now" is "as tuned"
    tuned_from: str

    @property
    def worse_by(self) -> float:
        return worse_by(self.metric, self.tuned, self.now)

    @property
    def slower(self) -> bool:
        return self.worse_by > self.noise

    def to_dict(self) -> JSONObject:
        return {"metric": self.metric, "tuned": self.tuned, "now": self.now,
                "noise": self.noise, "tuned_from": self.tuned_from,
                "worse_by": self.worse_by}


def _noise(metric: str) -> float:
    if "throughput" in metric:
        return THROUGHPUT_NOISE
    if metric == "goodput":
        # Requests meeting the SLO per second: as steady as throughput while
        # the SLO holds with room, as noisy as the tail it limits near it.
        return GOODPUT_NOISE
    return NOISE.get(metric.rpartition("_")[2], 0.25)


def _reference(profile: Profile, metric: str,
               obj: Objective | None = None) -> tuple[float, float, str] | None:
    """(tuned value, noise band as a share, where both came from).

    The confirmation's medians are in the units of the objective's own
    value (``Objective.confirmed_metric``: req/s for goodput, the latency
    for a Pareto point), so they are the reference for that metric only;
    any other metric is read from the search's measurement of the winner."""
    obj = obj or get_objective(
        (profile.metrics.get("objective") or {}).get("name") or "e2e_p99")
    best = profile.metrics.get("best") or {}
    value = metric_value(best, metric) if best else None
    source = "the search's measurement"
    conf = (profile.metrics.get("confirmation") or {}).get(str(profile.study.trial))
    spread = 0.0
    if metric == obj.confirmed_metric and isinstance(conf, dict) \
            and isinstance(conf.get("median"), (int, float)):
        value, source = float(conf["median"]), "the median of its confirmation runs"
        vals = [float(v) for v in conf.get("values") or [] if isinstance(v, (int, float))]
        if len(vals) >= 2 and value > 0:
            spread = max(abs(v - value) for v in vals) / value
    if value is None and metric == obj.confirmed_metric:
        best_value = (profile.metrics.get("objective") or {}).get("best")
        if isinstance(best_value, (int, float)) and not isinstance(best_value, bool):
            value, source = float(best_value), "the objective's best"
    if value is None:
        return None
    return float(value), max(_noise(metric), spread), source


def check(profile: Profile, url: str, *, requests: int | None = None, repeat: int = 1,
          progress: Callable[[str], None] | None = None) -> CheckResult:
    url = check_url(url)
    engine = ENGINES.get(profile.engine.name)
    if engine is None:
        raise InputError(f"profile {profile.name}: qtune has no adapter for engine "
                         f"{profile.engine.name!r}", hint="available: "
                         + ", ".join(sorted(ENGINES)))
    obj_name = (profile.metrics.get("objective") or {}).get("name") or "e2e_p99"
    obj = get_objective(obj_name)  # refuses an unknown name before any request
    # check has no --model: the served name is compared with the profile's.
    served, root = served_model(url, hint="is --url the server's base URL (the one "
                                "that answers /v1/models)?")
    reports = {p: t for p in engine.report_paths()
               if (t := _get(url.rstrip("/") + p)) is not None}
    running = engine.running_config(reports)
    config = compare_config(profile, running, served)
    out: CheckResult = {"profile": profile.name, "url": mask_url(url), "served": served,
                        "engine_version": running.version, "config": config}
    if config["differ"]:
        out["verdict"], out["exit_code"] = "not the tuned config", NOT_TUNED
        return out
    wl = Workload(**profile.workload)
    # A seed the search never used: fresh prompts, not the cached ones.
    wl = dataclasses.replace(wl, seed=random.SystemRandom().randrange(1 << 30))
    if requests is not None:
        wl = dataclasses.replace(wl, requests=requests, duration=None)
    slos = parse_slo(",".join(profile.slo))
    at = None
    if obj_name == "capacity":
        cap = (profile.metrics.get("objective") or {}).get("best")
        if not isinstance(cap, (int, float)) or cap <= 0:
            raise InputError(f"profile {profile.name}: tuned for capacity but holds none",
                             hint="re-run the search")
        wl = (dataclasses.replace(wl, concurrency=int(cap)) if wl.concurrency is not None
              else dataclasses.replace(wl, rate=float(cap)))
        at = f"{cap:g} {'streams' if wl.concurrency is not None else 'req/s'}"
    tok, warning = prompt_tokenizer(url, served, [root, profile.model.get("path")])
    cfg = BenchConfig(urls=[url], workload=wl, model=served, tokenizer=tok, slo=slos,
                      metric_names=engine.metric_names(),
                      request_fields=engine.request_fields(),
                      reset_cache=False)  # not qtune's server: fresh prompts instead
    runs = []
    for i in range(repeat):
        if progress:
            progress(f"run {i + 1}/{repeat}")
        w = dataclasses.replace(wl, seed=seeds.seed(wl.seed, Phase.CHECK, i))
        runs.append(measure(url, served, w, cfg, progress=progress))
    out["runs"] = [{k: r.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms",
                                          "request_throughput", "completed", "failed")}
                   for r in runs]
    if warning:
        out["tokenizer_warning"] = warning
    if obj_name == "capacity":
        # The same judgement a capacity probe gets (SLO, failures, keeping up).
        judged = [judge_load(r, slos, wl.rate) for r in runs]
        out["at"] = at
        out["judged"] = [why for _, why, _ in judged]
        broke = [why for ok, why, _ in judged if not ok]
        if not broke:
            out["verdict"] = f"as tuned: the SLO holds at its capacity ({at})"
            out["exit_code"] = AS_TUNED
        else:
            out["verdict"] = (f"slower than tuned: at its capacity ({at}) {broke[0]} "
                              f"({len(broke)} of {len(runs)} runs)")
            out["exit_code"] = SLOWER
        return out
    compared = []
    for metric in obj.judged_metrics:
        ref = _reference(profile, metric, obj)
        vals = [v for r in runs if (v := metric_value(r, metric)) is not None]
        if ref is None or not vals:
            raise InputError(f"profile {profile.name}: no measured {metric} to compare "
                             f"with ({obj.name} profile)",
                             hint="check a profile written by qtune search")
        tuned, band, source = ref
        compared.append(Comparison(metric, tuned, statistics.median(vals), band, source))
    # "compare": the objective's own metric (the first), as before; every
    # judged metric in "compared".
    out["compare"] = compared[0].to_dict()
    out["compared"] = [c.to_dict() for c in compared]
    slower = [c for c in compared if c.slower]
    if slower:
        c = slower[0]
        out["verdict"] = (f"slower than tuned by {c.worse_by:.0%} on {c.metric} "
                          f"({_num(c.now)} against {_num(c.tuned)}; noise {c.noise:.0%})")
        out["exit_code"] = SLOWER
    else:
        out["verdict"] = ("as tuned: " + ", ".join(
            f"{c.metric} {_num(c.now)} against {_num(c.tuned)}" for c in compared)
            + f" (within the {max(c.noise for c in compared):.0%} noise)")
        out["exit_code"] = AS_TUNED
    return out


def _num(v: float) -> str:
    """A figure in a verdict: 3 significant digits, so 0.42 req/s and
    1234 ms both read (``:.1f`` printed a goodput of 0.04 as 0.0)."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
