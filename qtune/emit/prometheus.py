"""Prometheus recording and alert rules from a profile (``--format
prometheus-rules``).

A profile knows what no monitoring setup knows by itself: the SLO it was
tuned for and the load it measured.  The rules turn those into alerts on the
engine's own metrics (names from its adapter, ``Engine.metric_names``):

- a latency percentile over the SLO for 10 minutes, from the engine's
  histograms over 5-minute rates (without an SLO: over the p99 the profile
  measured plus 25%, the spread of one p99 between clients and runs in
  ``benchmarks/``);
- completed requests per second above 80% of the measured capacity (or, for
  a profile not tuned on capacity, above the load it was measured at: a
  lower bound, said so in the annotation) for 10 minutes;
- the waiting queue never empty for 5 minutes and still growing;
- KV cache above 95% for 5 minutes; any preemption; no series from the
  server for 2 minutes (down, or not scraped).

Every alert's annotations name the profile figure its threshold came from.
Prometheus expands annotations (and labels) as Go templates, with ``query``
and the alert's labels at hand: a served model name is the server's text, so
every brace in an annotation is written as a template action that prints it
(``template_text``), and no name can add an action of its own.
Rules select the served model by the engine's model label, so several
profiles can share one Prometheus.  Checked by the real ``promtool check
rules`` and ``promtool test rules`` in the tests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from qtune.emit.common import one_line, summary_lines
from qtune.engines import ENGINES
from qtune.errors import InputError
from qtune.launch import MetricNames
from qtune.objectives import SLO, parse_slo
from qtune.profile import Profile

# Shares and windows.  Why these: a p99 over 5 minutes of a few req/s rests
# on a few hundred requests; 10 minutes "for" keeps one slow burst (run 8 on
# the H200: one run's TTFT p99 was 1.5x its neighbours') from paging anyone.
RATE_WINDOW = "5m"
SUSTAIN = "10m"
CAPACITY_SHARE = 0.8
NO_SLO_MARGIN = 1.25
KV_FULL = 0.95

_HIST = {"ttft": "ttft_seconds", "tpot": "tpot_seconds", "itl": "itl_seconds",
         "e2e": "e2e_seconds"}
LATENCY_WHAT = {"ttft": "time to first token", "tpot": "time per output token",
         "itl": "inter-token latency", "e2e": "end-to-end latency"}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def promql_string(text: str) -> str:
    """A PromQL double-quoted string literal for ``text``, read back as
    ``text`` by Prometheus' lexer (Go's escapes): ``"`` and ``\\`` escaped,
    so no value can close the matcher early; anything not printable (line
    breaks, controls, format characters) as ``\\uXXXX``/``\\UXXXXXXXX``,
    so the literal stays one line.  Printable non-ASCII stays as it is:
    JSON's ``\\ud800\\udc00`` surrogate pairs are invalid code points to
    Prometheus, which refused the rules for a name such as U+10000."""
    out = []
    for ch in text:
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            raise InputError("a served model name holds a lone UTF-16 surrogate, "
                             "which no Prometheus label can hold",
                             hint="fix model.served_name in the profile")
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def template_text(text: str) -> str:
    """``text`` for a Prometheus annotation: read back as ``text`` by Go's
    text/template.  Each ``{`` and ``}`` becomes an action printing it, so
    the text between actions holds no brace and no ``{{`` can start one."""
    return re.sub(r"[{}]", lambda m: '{{"' + m[0] + '"}}', one_line(text))


def figure(value: object, high: float = 1e9) -> float | None:
    """A measured figure an emitter may write as a threshold: a finite,
    positive number below ``high`` (a profile's free-form metrics may hold
    ``.inf`` or 1e300, which would become ``threshold: inf`` in KEDA,
    ``Infinity`` in Grafana's JSON and an alert that never fires)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and 0 < v < high else None


def _rule_id(text: str) -> str:
    """CamelCase from the profile name for alert names (``[A-Za-z0-9_]``)."""
    parts = re.split(r"[^A-Za-z0-9]+", text)
    return "".join(p[:1].upper() + p[1:] for p in parts if p) or "Profile"


def capacity(profile: Profile) -> tuple[float, str] | None:
    """(req/s, where it came from) for the request-rate alert."""
    obj = profile.metrics.get("objective") or {}
    best = profile.metrics.get("best") or {}
    # a million req/s per replica is beyond any server: a figure above is no measurement
    cap = figure(obj.get("best"), 1e6)
    if obj.get("name") == "capacity" and cap is not None:
        return cap, f"capacity {cap:g} req/s measured under the SLO"
    served = figure(best.get("request_throughput"), 1e6)
    if served is not None:
        offered = figure(profile.workload.get("rate"), 1e6)
        at = f" at {offered:g} offered" if offered is not None else ""
        return float(served), (f"{served:.2f} req/s served in the profile's measurement"
                               f"{at} (not a capacity: tune with --objective capacity "
                               "for one)")
    return None


def model_matcher(profile: Profile, fmt: str) -> tuple[str, str]:
    """(``{model_label="served"}`` or "", the completed-request counter's
    name) for a profile whose engine qtune knows."""
    sig = signals(profile, fmt)
    if sig.names.request_success is None:
        raise InputError(f"the {profile.engine.name} adapter names no completed-request "
                         "counter", hint="scale on another signal by hand")
    return sig.sel, sig.names.request_success


def _preemptions_note(profile: Profile) -> str:
    server = (profile.metrics.get("best") or {}).get("server") or {}
    n = server.get("preemptions")
    if not isinstance(n, int):
        return "the profile holds no preemption count"
    return (f"the profile's measurement saw {n} preemptions at its own load"
            + ("" if n else ": any now means more load or longer requests than tuned for"))


def latency_targets(profile: Profile) -> list[tuple[SLO, str]]:
    """(SLO, where its threshold came from) for each latency alert."""
    slos = [s for s in parse_slo(",".join(profile.slo)) if s.metric != "throughput"]
    for s in slos:
        if figure(s.limit, 8.64e7) is None:
            raise InputError(f"profile slo: the {s.metric} limit is not a time above 0 "
                             "and below a day", hint="fix the profile's slo (e.g. "
                             "ttft_p99<=500ms)")
    if slos:
        return [(s, f"the profile's SLO {s}") for s in slos]
    best = profile.metrics.get("best") or {}
    out = []
    for metric in ("ttft", "tpot", "e2e"):
        p99 = figure((best.get(f"{metric}_ms") or {}).get("p99"), 8.64e7)  # ms: a day
        if p99 is not None:
            limit = p99 * NO_SLO_MARGIN
            out.append((SLO(f"{metric}_p99", "<=", limit),
                        f"no SLO in the profile: its measured {metric} p99 {p99:.1f} ms "
                        f"+{NO_SLO_MARGIN - 1:.0%} (run-to-run spread of a p99)"))
    return out


@dataclass(frozen=True)
class Signals:
    """The engine's series for one profile's served model, as PromQL: the
    one home of the expressions the alert rules, the Grafana dashboard
    (``qtune.emit.grafana``) and the KEDA trigger draw on."""

    names: MetricNames
    served: str
    sel: str  # {model_label="served"} or ""
    label: str | None  # the model label kept through sums, when there is one

    def by(self, *extra: str) -> str:
        keep = [*extra, *([self.label] if self.label else [])]
        return f" by ({', '.join(keep)})" if keep else ""

    def per_second(self, counter: str | None) -> str | None:
        """A counter's rate over RATE_WINDOW, summed over replicas."""
        return (f"sum{self.by()} (rate({counter}_total{self.sel}[{RATE_WINDOW}]))"
                if counter else None)

    def rate(self) -> str | None:
        """Completed requests per second."""
        return self.per_second(self.names.request_success)

    def total(self, gauge: str | None) -> str | None:
        """A gauge summed over replicas (requests running or waiting)."""
        return f"sum{self.by()} ({gauge}{self.sel})" if gauge else None

    def peak(self, gauge: str | None) -> str | None:
        """A gauge's highest replica (KV-cache use is per engine: a sum over
        replicas would pass 100%)."""
        return f"max{self.by()} ({gauge}{self.sel})" if gauge else None

    def prefix_hit_rate(self) -> str | None:
        """Share of prompt tokens the prefix cache served over RATE_WINDOW."""
        hits = self.per_second(self.names.prefix_cache_hits)
        queries = self.per_second(self.names.prefix_cache_queries)
        return f"{hits} / {queries}" if hits and queries else None

    def latency(self, slo: SLO) -> str | None:
        """The SLO term's statistic, in seconds, over RATE_WINDOW."""
        metric, _, stat = slo.metric.rpartition("_")
        hist = getattr(self.names, _HIST[metric], None)
        if hist is None:
            return None  # the engine exports no histogram for it
        if stat == "mean":
            return (f"sum{self.by()} (rate({hist}_sum{self.sel}[{RATE_WINDOW}])) / "
                    f"sum{self.by()} (rate({hist}_count{self.sel}[{RATE_WINDOW}]))")
        return (f"histogram_quantile({QUANTILES[stat]}, sum{self.by('le')} "
                f"(rate({hist}_bucket{self.sel}[{RATE_WINDOW}])))")


def signals(profile: Profile, fmt: str) -> Signals:
    engine = ENGINES.get(profile.engine.name)
    if engine is None:
        raise InputError(f"--format {fmt}: qtune has no adapter for engine "
                         f"{profile.engine.name!r}, so it does not know its metric names",
                         hint="available engines: " + ", ".join(sorted(ENGINES)))
    names = engine.metric_names()
    if names is None:
        raise InputError(f"--format {fmt}: the {profile.engine.name} adapter "
                         "names no metrics", hint="use an engine that exports Prometheus "
                         "metrics")
    served = str(profile.model.get("served_name") or profile.model.get("id") or "")
    label = names.model_label if names.model_label and served else None
    sel = f"{{{label}={promql_string(served)}}}" if label else ""
    return Signals(names, served, sel, label)


def rules(profile: Profile) -> dict[str, Any]:
    sig = signals(profile, "prometheus-rules")
    names, served, sel = sig.names, sig.served, sig.sel
    rid = _rule_id(profile.name)
    base_labels = {"qtune_profile": profile.name}
    records: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []

    def alert(name: str, expr: str, for_: str, severity: str, summary: str,
              threshold_from: str) -> None:
        rule: dict[str, Any] = {"alert": f"{rid}{name}", "expr": expr}
        if for_:
            rule["for"] = for_
        rule.update(labels={**base_labels, "severity": severity},
                    annotations={"summary": template_text(summary),
                                 "threshold_from": template_text(threshold_from)})
        alerts.append(rule)

    for slo, source in latency_targets(profile):
        expr = sig.latency(slo)
        if expr is None:
            continue
        metric, _, stat = slo.metric.rpartition("_")
        hist = str(getattr(names, _HIST[metric]))
        record = f"qtune:{hist.replace(':', '_')}:{stat}_{RATE_WINDOW}"
        records.append({"record": record, "expr": expr, "labels": dict(base_labels)})
        limit_s = slo.limit / 1000.0
        alert(f"{metric.upper()}{stat.upper()}OverSLO", f"{record}{sel} > {limit_s:g}",
              SUSTAIN, "page",
              f"{LATENCY_WHAT[metric]} {stat} over {slo.limit:g} ms for {SUSTAIN} "
              f"({served or profile.name})", source)

    cap = capacity(profile)
    rate_expr = sig.rate()
    if cap is not None and rate_expr is not None and names.request_success:
        rate_record = f"qtune:{names.request_success.replace(':', '_')}:rate_{RATE_WINDOW}"
        records.append({"record": rate_record, "labels": dict(base_labels),
                        "expr": rate_expr})
        value, source = cap
        alert("NearCapacity", f"{rate_record}{sel} > {value * CAPACITY_SHARE:.4g}", SUSTAIN,
              "warn", f"completed requests above {CAPACITY_SHARE:.0%} of {value:g} req/s "
              f"for {SUSTAIN}: add a replica before latency breaks",
              f"{CAPACITY_SHARE:.0%} of {source}")
    waiting = f"sum({names.requests_waiting}{sel})"
    if names.requests_waiting:
        alert("QueueGrowing", f"min_over_time({waiting}[5m:30s]) > 0 and "
              f"deriv({waiting}[{SUSTAIN}:30s]) > 0", SUSTAIN, "warn",
              "requests waiting for 5 minutes without the queue emptying, and growing: "
              "the server does not keep up",
              "a load holds only while the queue does not grow (how qtune decided "
              "capacity)")
    if names.kv_cache_usage:
        alert("KVCacheNearFull", f"max({names.kv_cache_usage}{sel}) > {KV_FULL}", "5m",
              "warn", f"KV cache above {KV_FULL:.0%} for 5 minutes: preemptions come next",
              "engine limit, not a profile figure")
    if names.preemptions:
        alert("Preempting",
              f"sum(increase({names.preemptions}_total{sel}[{RATE_WINDOW}])) > 0",
              "", "warn", "the engine preempted requests (KV cache exhausted): latency jumps",
              _preemptions_note(profile))
    if names.requests_running:
        alert("Down", f"absent_over_time({names.requests_running}{sel}[2m])", "", "page",
              f"no metrics from the {profile.engine.name} server for 2 minutes (down or "
              "not scraped)", "engine liveness")
    return {"groups": [{"name": f"qtune-{profile.name}", "rules": records + alerts}]}


def render(profile: Profile) -> str:
    head = summary_lines(profile) + [
        "Prometheus rules: load with rule_files; thresholds from the profile "
        "(see each alert's threshold_from)"]
    text = "".join(f"# {line}\n" for line in head)
    return text + yaml.safe_dump(rules(profile), sort_keys=False, width=1000)
