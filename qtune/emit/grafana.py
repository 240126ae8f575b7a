"""A Grafana dashboard from a profile (``--format grafana``).

The panels read the engine's own series through ``prometheus.Signals`` (the
PromQL the alert rules use, so a panel and its alert never disagree), and
draw what the profile measured as thresholds:

- TTFT, TPOT and E2E p50/p90/p99 from the histograms, the SLO (or, without
  one, the measured p99 +25% the alerts use) as a red line;
- completed requests per second, with 80% of the measured capacity (where
  the NearCapacity alert fires) and the capacity itself as lines;
- requests running and waiting, KV-cache use (95%, the alert's line),
  preemptions per second, and the prefix cache's hit rate.

A ``datasource`` variable picks the Prometheus; the title names the profile.
Built with Grafana's Foundation SDK (typed builders, offline), for Grafana
11.6 (the SDK release pinned in pyproject.toml); the tests validate the JSON
against the SDK's JSON schemas and every query through the real ``promtool``.
Expressions use fixed windows (``RATE_WINDOW``), never Grafana's
``$__rate_interval``, so they are plain PromQL that promtool can check.

Grafana interpolates ``$var``, ``${var}`` and ``[[var]]`` in titles,
descriptions, legends and queries, and has no escape for them: a served
model name is the server's text, so ``no_variables`` writes a ``$`` in a
query's string literal as ``\\x24`` (PromQL reads it back as ``$``) and in
other text as U+FF04 (＄), and ``[[`` as ``[ [``; the one variable qtune
means, ``${datasource}``, is the only one left.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import timeseries as tb
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from qtune.emit.common import summary_lines
from qtune.emit.prometheus import (
    CAPACITY_SHARE,
    KV_FULL,
    LATENCY_WHAT,
    QUANTILES,
    RATE_WINDOW,
    Signals,
    capacity,
    latency_targets,
    signals,
)
from qtune.objectives import SLO
from qtune.profile import Profile

DATASOURCE_VAR = "datasource"
_DS = dm.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VAR + "}")
_LATENCY = ("ttft", "tpot", "e2e")
_WIDTH = 12  # two panels to a row of Grafana's 24 columns
_HEIGHT = 8


def uid(profile: Profile) -> str:
    """A stable dashboard uid (Grafana: at most 40 of ``[A-Za-z0-9_-]``):
    re-importing the same profile's dashboard replaces it."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", profile.name).strip("-")[:24]
    digest = hashlib.sha256(profile.name.encode()).hexdigest()[:8]
    return f"qtune-{slug}-{digest}" if slug else f"qtune-{digest}"


def _thresholds(lines: list[tuple[float, str]]) -> db.ThresholdsConfig:
    """Absolute steps: green below the first line, each line's colour from it."""
    steps = [dm.Threshold(value=None, color="green")]
    steps += [dm.Threshold(value=v, color=c) for v, c in sorted(lines)]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(title: str, description: str, unit: str,
           queries: list[tuple[str, str]], lines: list[tuple[float, str]]) -> tb.Panel:
    """A time series panel of (PromQL, legend) with threshold lines drawn
    (dashed) when ``lines`` holds any."""
    panel = (tb.Panel().title(title).description(description).datasource(_DS).unit(unit)
             .height(_HEIGHT).span(_WIDTH).thresholds(_thresholds(lines))
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(
                 cm.GraphThresholdsStyleMode.DASHED if lines
                 else cm.GraphThresholdsStyleMode.OFF))
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.NONE)))
    for i, (expr, legend) in enumerate(queries):
        panel.with_target(pb.Dataquery().expr(expr).legend_format(legend)
                          .ref_id(chr(ord("A") + i)).range().datasource(_DS))
    return panel


def _latency_panel(sig: Signals, metric: str, targets: list[tuple[SLO, str]]) -> tb.Panel | None:
    queries = []
    for stat in QUANTILES:
        expr = sig.latency(SLO(f"{metric}_{stat}", "<=", 0.0))
        if expr is None:
            return None  # the engine exports no histogram for it
        queries.append((expr, stat))
    mine = [(slo, source) for slo, source in targets
            if slo.metric.rpartition("_")[0] == metric]
    lines = [(slo.limit / 1000.0, "red") for slo, _ in mine]
    said = "; ".join(f"red line: {slo.metric} {slo.limit:g} ms, from {source}"
                     for slo, source in mine) or "no SLO or measured p99 for it"
    return _panel(f"{LATENCY_WHAT[metric].capitalize()} ({metric.upper()})",
                  f"p50/p90/p99 over {RATE_WINDOW} from the engine's histogram; {said}",
                  "s", queries, lines)


def panels(profile: Profile) -> list[tb.Panel]:
    sig = signals(profile, "grafana")
    names = sig.names
    out = [p for m in _LATENCY if (p := _latency_panel(sig, m, latency_targets(profile)))]
    rate = sig.rate()
    if rate is not None:
        cap = capacity(profile)
        lines = ([(cap[0] * CAPACITY_SHARE, "orange"), (cap[0], "red")] if cap else [])
        said = (f"orange line: {CAPACITY_SHARE:.0%} (NearCapacity alert), red line: "
                f"100% of {cap[1]}" if cap else "the profile holds no measured rate")
        out.append(_panel("Completed requests per second",
                          f"over {RATE_WINDOW}; {said}", "reqps", [(rate, "completed")], lines))
    queue = [(e, what) for e, what in ((sig.total(names.requests_running), "running"),
                                       (sig.total(names.requests_waiting), "waiting"))
             if e is not None]
    if queue:
        out.append(_panel("Requests running and waiting",
                          "a waiting queue that does not empty: the server does not keep up",
                          "short", queue, []))
    kv = sig.peak(names.kv_cache_usage)
    if kv is not None:
        out.append(_panel("KV-cache use (fullest replica)",
                          f"orange line: {KV_FULL:.0%} (KVCacheNearFull alert); preemptions "
                          "follow a full cache", "percentunit", [(kv, "KV cache")],
                          [(KV_FULL, "orange")]).min(0).max(1))
    pre = sig.per_second(names.preemptions)
    if pre is not None:
        out.append(_panel("Preemptions per second",
                          f"over {RATE_WINDOW}; any means the KV cache ran out", "short",
                          [(pre, "preemptions")], []))
    hit = sig.prefix_hit_rate()
    if hit is not None:
        out.append(_panel("Prefix-cache hit rate",
                          f"share of prompt tokens served from the prefix cache over "
                          f"{RATE_WINDOW}", "percentunit", [(hit, "hit rate")], []).min(0).max(1))
    return out


def dashboard(profile: Profile) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict)."""
    sig = signals(profile, "grafana")
    title = f"qtune: {profile.name}" + (f" ({sig.served})" if sig.served else "")
    board = (db.Dashboard(title).uid(uid(profile)).tags(["qtune", profile.engine.name])
             .description(" | ".join(summary_lines(profile)))
             .editable().time("now-1h", "now").refresh("30s").timezone("browser")
             .tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .with_variable(db.DatasourceVariable(DATASOURCE_VAR).label("Prometheus")
                            .type("prometheus")))
    for panel in panels(profile):
        board.with_panel(panel)
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    out: dict[str, Any] = no_variables(data)
    return out


_OURS = "${" + DATASOURCE_VAR + "}"


def no_variables(value: Any, key: str = "") -> Any:
    """``value`` with no Grafana variable reference but ``${datasource}``."""
    if isinstance(value, dict):
        return {k: no_variables(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [no_variables(v, key) for v in value]
    if not isinstance(value, str) or value == _OURS:
        return value
    if key == "expr":
        # qtune's PromQL holds "$" and "[[" only inside the model's string
        # literal, where Go's escapes read back as the same characters.
        return value.replace("$", "\\x24").replace("[[", "[\\x5b")
    return value.replace("$", "\uff04").replace("[[", "[ [")


def render(profile: Profile) -> str:
    # allow_nan=False: Grafana's JSON parser refuses Infinity (figure() keeps
    # every threshold finite; this is the format's own guard)
    return json.dumps(dashboard(profile), indent=2, sort_keys=False,
                      allow_nan=False) + "\n"
