"""Everything qtune prints for people (the only module that imports rich).

Human output goes to stderr so that ``--json`` output on stdout stays
machine-readable; the JSON itself is printed by the CLI.

Over 500 lines on purpose: all human output lives here (one renderer per
command, and the live search reporter), so that no other module prints or
imports rich, and untrusted text has one way to the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text as _RichText

from qtune.errors import QtuneError, clip, mask_url, printable, redact
from qtune.metrics import overload_text
from qtune.stats import VerdictCapacity

if TYPE_CHECKING:
    from qtune.search.records import TrialRecord
    from qtune.search.result import TuneResult


class Text(_RichText):
    """Rich's Text, its content one line: every Text qtune builds may hold
    data (a trial's detail, a model id), and a newline in it would draw a
    line of its own ("error: ..." forged) that the console cannot tell from
    layout.  Rich's own Text objects (tables, wrapping) are not this class."""

    def __init__(self, text: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(printable(text), *args, **kwargs)


class _Console(Console):
    """A console that never interprets what it is given: no markup (a model
    id ``evil[/]`` is text, not a closing tag that raises), no emoji codes,
    and every control character in the text drawn visibly (``\\x1b``) at the
    last step, where the segments are joined.  Rich's own escape sequences
    (styles, cursor moves of a live display) are separate segments and pass;
    only the characters that came from text are escaped, so every path
    (tables, Text objects, plain strings, the internal-error line) is covered
    in one place instead of at each call site."""

    def render_str(self, text: str, **kwargs: Any) -> _RichText:
        # A string given to print() (or a table cell) is one line of text:
        # a newline in a path or a model id must not start a forged line.
        return super().render_str(printable(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control or seg.text == "\n"
            else Segment(_visible(seg.text), seg.style, seg.control)
            for seg in buffer)


def _visible(text: str) -> str:
    # Newlines are the layout's own line breaks; everything else printable().
    return "\n".join(printable(part) for part in text.split("\n")) if text else text


err = _Console(stderr=True, highlight=False, markup=False, emoji=False)
out = _Console(highlight=False, markup=False, emoji=False)


def render_error(exc: QtuneError) -> None:
    err.print(Text("error: ", style="bold red") + Text(exc.message))
    if exc.hint:
        # Not wrapped at the terminal's width: a hint that is a command is
        # pasted whole (a wrap mid-command broke it at 80 columns).
        err.print(Text("hint: ", style="yellow") + Text(exc.hint), soft_wrap=True)


def _gib(b: int | None) -> str:
    return "?" if b is None else f"{b / 2**30:.1f} GiB"


def render_probe(d: dict[str, Any]) -> None:
    cpu = d["cpu"]
    t = Table(title="host", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("cpu", f"{cpu['model']}")
    t.add_row("", f"{cpu['sockets']} socket(s), {cpu['physical_cores']} cores, "
              f"{cpu['logical_cpus']} logical CPUs, SMT "
              f"{'on' if cpu['smt_active'] else 'off'}")
    if cpu["flags"]:
        t.add_row("", "features: " + " ".join(cpu["flags"]))
    gov = ", ".join(f"{g} ({n})" for g, n in cpu["governors"].items()) or "not exposed"
    t.add_row("governor", gov)
    for n in d["numa"]["nodes"]:
        t.add_row(f"numa node {n['id']}",
                  f"cpus {n['cpulist']}, memory {_gib(n['memory_total'])}")
    m = d["memory"]
    t.add_row("memory", f"{_gib(m['total'])} total, {_gib(m['available'])} available")
    t.add_row("thp", f"enabled={d['thp']['enabled']} defrag={d['thp']['defrag']}")
    if d["gpus"]:
        drv = d["gpu_driver"]
        t.add_row("gpu driver", f"{drv['driver_version']} (CUDA {drv['cuda_version']})")
        for g in d["gpus"]:
            link = (f"PCIe gen{g['pcie_gen']}/{g['pcie_gen_max']} "
                    f"x{g['pcie_width']}/{g['pcie_width_max']}")
            nv = (f", NVLink {g['nvlink_active_links']} links to {g['nvlink_peers']}"
                  if g["nvlink_active_links"] else "")
            numa = (f"NUMA {g['numa_node']}" if g["numa_node"] is not None
                    else "NUMA not reported")
            t.add_row(f"gpu {g['index']}",
                      f"{g['name']}, {_gib(g['memory_total'])}, cc {g['compute_capability']}, "
                      f"{numa}, {link}{nv}")
    else:
        t.add_row("gpus", f"none ({d['gpu_driver']['note']})")
    eng = d["engines"]["installed"]
    t.add_row("engines", ", ".join(f"{e['name']} {e['version']} ({e['build']})"
                                   for e in eng) or "none found")
    out.print(t)
    if d["findings"]:
        ft = Table(title="findings", show_lines=False)
        ft.add_column("id")
        ft.add_column("severity")
        ft.add_column("seen")
        ft.add_column("fix")
        colour = {"error": "red", "warning": "yellow", "info": "cyan"}
        for f in d["findings"]:
            ft.add_row(f["id"], Text(f["severity"], style=colour[f["severity"]]),
                       f["seen"], f["fix"])
        out.print(ft)
    else:
        out.print("findings: none")


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None or v != v:  # None, or NaN from a pandas table
        return "-"
    return f"{v:,.1f}{unit}" if abs(v) < 1e5 else f"{v:,.0f}{unit}"


class SearchReporter:
    """Live progress of a study: a status line for the running trial and a
    row per finished trial, with the best so far and the time left."""

    def __init__(self, objective: str, quiet: bool = False) -> None:
        self.objective = objective
        self.quiet = quiet
        self.live: Live | None = None
        self.started = time.monotonic()
        self.total = 0
        self.done_launched = 0
        self.trial_times: list[float] = []
        self.phase_text = ""
        self.budget: float | None = None

    def __enter__(self) -> SearchReporter:
        if not self.quiet:
            self.live = Live(Text(""), console=err, refresh_per_second=4,
                             transient=True)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def _eta(self) -> str:
        if not self.trial_times:
            return "unknown"
        left = max(self.total - self.done_launched, 0)
        avg = sum(self.trial_times) / len(self.trial_times)
        secs = left * avg
        if self.budget:
            secs = min(secs, max(0.0, self.budget - (time.monotonic() - self.started)))
        return f"~{secs / 60:.0f} min" if left else "0 min"

    def note(self, text: str) -> None:
        if not self.quiet:
            err.print(Text(text, style="yellow"))

    def study_started(self, info: dict[str, Any]) -> None:
        self.total = info["trials"]
        self.budget = info.get("time_budget")
        if self.quiet:
            return
        err.print(Text(f"study {info['study']}", style="bold"))
        err.print(f"  engine   {info['engine']}")
        m = info["model"]
        err.print(f"  model    {m['id']} ({m['layers']} layers, {m['heads']} heads, "
                  f"{m['kv_heads']} KV heads, load format {m['load_format']})")
        wl = info["workload"]
        bound = " ".join(x for x in (
            f"{wl['requests']} requests" if wl["requests"] else "",
            f"{wl['duration']:g} s" if wl["duration"] else "") if x)
        arrival = wl.get("arrival") or "poisson"
        if arrival == "poisson" and wl.get("burstiness", 1.0) not in (None, 1.0):
            arrival = f"gamma (burstiness {wl['burstiness']:g})"
        load = (f"{arrival} {wl['rate']:g} req/s" if wl["rate"] is not None
                else f"concurrency {wl['concurrency'] or 1}")
        if info.get("levels"):
            load += " (levels " + ", ".join(f"{v:g}" for v in info["levels"]) + \
                " on each server)"
        err.print(f"  load     {wl['input_len']} in / {wl['output_len']} out tokens, "
                  f"{load}, {bound}, {wl['warmup_requests']} warm-up")
        err.print(f"  goal     {info['objective']}"
                  + (f" with SLO {', '.join(info['slo'])}" if info["slo"] else ""))
        err.print("  space    " + ", ".join(f"{k} {v}" for k, v in info["space"].items()))
        if info["fixed"]:
            err.print(f"  fixed    {info['fixed']}")
        err.print(f"  storage  {mask_url(info['storage'])}")

    def trial_phase(self, number: int, phase: str, detail: str) -> None:
        if self.live:
            elapsed = (time.monotonic() - self.started) / 60
            self.live.update(Text(
                f"trial {number} [{self.done_launched + 1}/{self.total}] {phase}: "
                f"{detail}   (elapsed {elapsed:.1f} min, left {self._eta()})",
                style="dim"))

    def trial_done(self, rec: TrialRecord, best: TrialRecord | None) -> None:
        if rec.status != "invalid" and rec.server_of is None:
            self.done_launched += 1
            if rec.total_s:
                self.trial_times.append(rec.total_s)
        if self.quiet:
            return
        tag = "baseline " if rec.baseline else ""
        if rec.server_of is not None:
            tag += f"(server of trial {rec.server_of}, load {rec.load_level:g}) "
        elif rec.load_level is not None:
            tag += f"(load {rec.load_level:g}) "
        params = " ".join(f"{k}={v}" for k, v in rec.params.items()) or "engine defaults"
        if rec.status == "ok":
            s = rec.summary or {}
            e2e, ttft = s["e2e_ms"] or {}, s["ttft_ms"] or {}
            flag = "" if rec.feasible else Text(" (infeasible)", style="red").plain
            head = f"{self.objective}={_fmt(rec.value)}"
            if rec.values:  # pareto: both objectives
                from qtune.objectives import get_objective

                lat = get_objective(self.objective).run_metric
                head = f"req/s={_fmt(rec.values[0])} {lat}={_fmt(rec.values[1])}"
            if s.get("contaminated"):
                flag += f" (not used: {s['contaminated']})"
            line = (f"{head}{flag}  "
                    f"ttft p50/p99 {_fmt(ttft.get('p50'))}/{_fmt(ttft.get('p99'))} ms  "
                    f"e2e p99 {_fmt(e2e.get('p99'))} ms  "
                    f"{s['request_throughput']:.2f} req/s  failed {s['failed']}  "
                    f"start {rec.startup_s:.0f} s, warm-up {s.get('warmup_s', 0):.1f} s, "
                    f"measured {s['duration_s']:.1f} s")
            style = "green" if best is not None and best.number == rec.number else ""
        elif rec.status == "invalid":
            line = f"skipped, not launched: {rec.detail}"
            style = "dim"
        elif rec.status == "pruned":
            line = f"pruned: {rec.detail} (start {rec.startup_s or 0:.0f} s)"
            style = "yellow"
        else:
            line = f"{rec.status}: {rec.reason}: {redact(rec.detail or '')[:160]}"
            style = "red"
        best_txt = (f"best so far: trial {best.number} {_fmt(best.value)}"
                    if best is not None else "no feasible trial yet")
        err.print(Text(f"trial {rec.number} {tag}", style="bold") + Text(params))
        err.print(Text(f"    {line}", style=style))
        for extra in _trial_time_lines(rec):
            err.print(Text(f"    {extra}", style="dim"))
        if rec.status == "ok" and (over := (rec.summary or {}).get("overloaded")):
            err.print(Text(f"    {overload_text(over)}", style="yellow"))
        if rec.status == "ok" and (lagged := (rec.summary or {}).get("client_lagged")):
            err.print(Text(f"    {printable(lagged)}", style="yellow"))
        if rec.status == "ok" and (uneven := _uneven_replicas(
                (rec.summary or {}).get("server"))):
            err.print(Text(f"    {uneven}", style="yellow"))
        spec = ((rec.summary or {}).get("server") or {}).get("spec_decode")
        if rec.status == "ok" and spec:  # speculative decoding: the engine's counters
            err.print(Text(f"    speculative: acceptance {spec['acceptance_rate']:.1%} "
                           f"({spec['accepted_tokens']}/{spec['draft_tokens']} draft "
                           f"tokens), {spec['mean_acceptance_length']:.2f} tokens per "
                           "drafted step", style="dim"))
        if rec.status == "ok" and rec.quality and rec.server_of is None:
            from qtune.quality import Quality

            q = Quality.from_dict(rec.quality)
            if q is not None:
                bad = rec.reason == "quality_loss"
                err.print(Text(f"    {rec.detail if bad else 'quality: ' + q.text()}",
                               style="red" if bad else "dim"))
        if rec.status != "invalid":
            err.print(Text(f"    {best_txt}; left {self._eta()}", style="dim"))


def _trial_time_lines(rec: Any) -> list[str]:
    """Where a launched trial's time went: its start's phases (from the
    engine's log) and, for a capacity trial, its probes."""
    out = []
    phases = rec.start_phases or {}
    if phases.get("ready_s") is not None:
        from qtune.launch import StartPhases

        out.append(StartPhases(**{k: v for k, v in phases.items() if k != "other_s"}).text())
    summary = rec.summary or rec.partial_summary or {}
    cap = summary.get("capacity") or {}
    if cap.get("steps"):
        out.append(capacity_line(cap))
    return out


def capacity_line(cap: dict[str, Any]) -> str:
    """A capacity search's probes in one line: how many, how long, the
    loads and their verdicts, and what stopping early saved."""
    steps = cap["steps"]
    loads = " ".join(f"{st['load']:g}{'✓' if st['ok'] else '✗'}"
                     + ("×2" if st.get("remeasure") else "") for st in steps)
    saved = cap.get("saved_s") or 0.0
    return (f"{len(steps)} probe{'s' if len(steps) != 1 else ''} in "
            f"{cap.get('probes_s', 0.0):.0f} s ({loads})"
            + (f"; stopping failed probes early saved {saved:.0f} s" if saved >= 1 else ""))


def render_search_result(res: TuneResult) -> None:
    if res.best is None:
        err.print(Text("no feasible configuration found", style="bold red"))
        return
    t = Table(title="result")
    t.add_column("")
    t.add_column("baseline (defaults)")
    t.add_column(f"best (trial {res.best.number})")
    b = res.baseline.summary if res.baseline and res.baseline.summary else None
    w = res.best.summary or {}
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        for p in ("p50", "p99"):
            t.add_row(f"{label} {p} (ms)",
                      _fmt(((b or {}).get(key) or {}).get(p)),
                      _fmt((w.get(key) or {}).get(p)))
    t.add_row("req/s", _fmt((b or {}).get("request_throughput")),
              _fmt(w["request_throughput"]))
    t.add_row("failed", str((b or {}).get("failed", "-")), str(w["failed"]))
    out.print(t)
    conf = (res.profile.metrics.get("confirmation") if res.profile else None) or {}
    # a capacity's unit: req/s, or streams in concurrency mode
    unit = str((w.get("capacity") or {}).get("unit") or "req/s")
    for n, c in sorted(conf.items(), key=lambda kv: int(kv[0])):
        ci = c["ci95"]
        base = res.baseline is not None and str(res.baseline.number) == n
        fresh = c.get("fresh")
        runs = fresh if fresh else c["values"]
        if c.get("bracket") is not None:  # a capacity: held again or not
            runs_txt = "; ".join(c.get("runs") or []) or "no fresh start finished"
            load = c.get("load", c["values"][0])
            asked = (f" (its own capacity {_fmt(c['values'][0])}; asked to hold the best "
                     "config's)" if load != c["values"][0] else "")
            if isinstance(c.get("asked"), list):  # each fresh start: asked, held
                pairs = list(zip(c["asked"], c.get("held") or [], strict=False))
                held = sum(1 for a, h in pairs if h is not None and h >= a)
                starts = len(pairs) + c.get("failures", 0) - sum(
                    1 for _, h in pairs if h is None)
                load_txt = "/".join(_fmt(a) for a in dict.fromkeys(c["asked"]))
            else:
                held = len(c.get("fresh") or [])
                starts = held + c.get("failures", 0)
                load_txt = _fmt(load)
            v = VerdictCapacity.from_dict(c.get("from_verdicts"))
            out.print(f"confirmed trial {n}{' (engine defaults)' if base else ''}: "
                      f"{load_txt} {unit} held on {held} of {starts} fresh "
                      f"starts{asked} ({runs_txt})"
                      + (f"; capacity {v.text(unit)}" if v else ""))
            continue
        out.print(f"confirmed trial {n}{' (engine defaults)' if base else ''}: "
                  f"median {_fmt(c['median'])} over "
                  f"{len(runs)}{' fresh' if fresh else ''} run{'' if len(runs) == 1 else 's'}"
                  + (f" [95% CI {_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
                  + f" ({', '.join(_fmt(v) for v in runs)}"
                  + (f"; the search's run {_fmt(c['values'][0])}, not counted)"
                     if fresh else ")"))
    if res.pareto_front:
        lat = next(k for k in res.pareto_front[0] if k not in ("trial", "throughput",
                                                                "params"))
        f = Table(title=f"Pareto front: throughput against {lat} (--pick N writes trial N)")
        levels = any("load" in p for p in res.pareto_front)  # --levels
        for col in ("trial", *(["load"] if levels else []), "req/s", f"{lat} ms", "params"):
            f.add_column(col)
        for pt in res.pareto_front:
            mark = " (profile)" if pt["trial"] == res.best.number else ""
            params = (" ".join(f"{k}={v}" for k, v in pt["params"].items())
                      or "defaults")
            load = [_fmt(pt["load"])] if levels else []
            f.add_row(f"{pt['trial']}{mark}", *load, _fmt(pt["throughput"]), _fmt(pt[lat]),
                      params)
        out.print(f)
    if res.engines:
        _render_engines(res.engines)
    if res.improvement:
        obj = (res.profile.metrics.get("objective") or {}) if res.profile else {}
        within = (" (within the noise: the confirmation runs overlap the defaults'; "
                  "check with qtune verify)" if obj.get("separated") is False else "")
        iv = obj.get("interval")
        if iv:  # capacities: the ratio of the brackets' ends
            hi = "inf" if iv[1] is None else f"{iv[1]:.2f}"
            within = f" [{iv[0]:.2f}, {hi}] from the capacities' brackets" + within
        out.print(f"improvement over the engine defaults: {res.improvement:.2f}x{within}")
        from qtune.search.result import overload_note

        # the improvement is a queue's: said right under it
        if res.best is not None and (over := overload_note(res.baseline, res.best)):
            out.print(Text(over, style="yellow"))
    elif res.baseline is not None and res.baseline.status != "ok":
        out.print(f"the engine defaults failed ({res.baseline.reason}): any working "
                  "configuration is an improvement")
    if res.pruning and res.pruning["pruned"]:
        out.print(f"pruning: {res.pruning['pruned']} trials stopped early, "
                  f"~{res.pruning['measure_s_saved']:.0f} s of measurement saved")
    if res.pruning and res.pruning.get("probes"):
        pr = res.pruning
        out.print(f"capacity: {pr['probes']} probes in all; {pr['below_incumbent']} config"
                  f"{'s' if pr['below_incumbent'] != 1 else ''} decided by one probe at the "
                  f"best capacity so far; stopping failed probes early saved "
                  f"~{pr['probe_s_saved']:.0f} s")
    acc = res.memory_estimate
    if acc and (acc["launches_avoided"] or acc["launched_with_prediction"]):
        out.print(f"memory estimate: {acc['launches_avoided']} launches avoided; right for "
                  f"{acc['prediction_right']}/{acc['launched_with_prediction']} launches")
    out.print(f"profile: {res.profile_path}")


def _render_engines(rows: list[dict[str, Any]]) -> None:
    """``--engine a,b``: each engine's best against the others'."""
    from qtune.search.choice import summary_lines

    out.print("each engine's best on this workload:")
    for line in summary_lines(rows):
        out.print(f"  {line}")


class Status:
    """A transient one-line status on stderr for long measurements."""

    def __init__(self) -> None:
        self.live = Live(Text(""), console=err, refresh_per_second=4, transient=True)
        self.started = time.monotonic()

    def __enter__(self) -> Status:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, text: str) -> None:
        self.live.update(Text(f"{text}  ({time.monotonic() - self.started:.0f} s)",
                              style="dim"))

    def log(self, text: str) -> None:
        """A line that stays (above the status; also when stderr is a file,
        where the transient status shows nothing)."""
        self.live.console.print(text, markup=False, highlight=False)


def _summary_table(title: str, cols: list[tuple[str, dict[str, Any]]]) -> Table:
    t = Table(title=title)
    t.add_column("metric")
    for name, _ in cols:
        t.add_column(name)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2e_ms", "E2E")):
        for p in ("mean", "p50", "p90", "p99"):
            t.add_row(f"{label} {p} (ms)",
                      *[_fmt((s.get(key) or {}).get(p)) for _, s in cols])
    t.add_row("req/s", *[_fmt(s.get("request_throughput")) for _, s in cols])
    t.add_row("output tok/s", *[_fmt(s.get("output_token_throughput")) for _, s in cols])
    t.add_row("completed / failed",
              *[f"{s.get('completed')} / {s.get('failed')}" for _, s in cols])
    return t


def failure_reasons(errors: dict[str, int]) -> str:
    """``{"HTTP 503: busy": 3, "timeout: request over 600 s": 1}`` →
    ``"3 HTTP 503, 1 timeout"``: counted by reason (the text before the first
    colon, as qtune.load.client words its errors), most frequent first."""
    by: dict[str, int] = {}
    for msg, n in errors.items():
        by[msg.split(":", 1)[0]] = by.get(msg.split(":", 1)[0], 0) + n
    return ", ".join(f"{n} {k}" for k, n in sorted(by.items(), key=lambda kv: -kv[1]))


def _bench_runs(res: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if "runs" in res:
        return [(f"{res['urls'][k]} run {i + 1}", r)
                for k, rs in enumerate(res["runs"]) for i, r in enumerate(rs)]
    if "capacity" in res:  # the steps carry what find_capacity copies into them
        return [(f"capacity step at {st['load']:g}", st) for st in res["capacity"]["steps"]]
    return [("", res)] if "completed" in res else []


def _bench_warnings(res: dict[str, Any]) -> None:
    """What makes a bench's figures not the ones asked for, on every output:
    failures with their reasons, prompt lengths the server counted otherwise,
    usage counts not believed, no tokenizer."""
    if res.get("tokenizer_warning"):
        out.print(Text("warning: " + printable(res["tokenizer_warning"]), style="yellow"))
    for where, r in _bench_runs(res):
        at = f" ({printable(where)})" if where else ""
        failed, total = r.get("failed", 0), r.get("completed", 0) + r.get("failed", 0)
        if failed:
            style = "red" if failed == total or failed > 0.05 * total else "yellow"
            out.print(Text(f"{failed} of {total} failed{at}: "
                           + printable(redact(failure_reasons(r.get("errors") or {}))),
                           style=style))
            for msg in list(r.get("errors") or {})[:3]:
                out.print(Text(f"  e.g. {printable(redact(msg))}", style=style))
        if (mm := r.get("length_mismatch")) is not None:
            pl = r["prompt_length"]
            out.print(Text(
                f"warning{at}: the server counted {pl['server_mean']:.0f} prompt tokens "
                f"a request where {pl['requested_mean']:.0f} were asked for ({mm:+.0%}): "
                "these figures are for another workload; pass --tokenizer DIR "
                "(the served model's folder)", style="bold red"))
        if r.get("contaminated"):
            out.print(Text(f"warning{at}: {r['contaminated']}; not used for a decision",
                           style="bold red"))
        if r.get("overloaded"):
            out.print(Text(f"warning{at}: {overload_text(r['overloaded'])}", style="yellow"))
        if rs := r.get("resent"):
            out.print(Text(
                f"note{at}: {rs['requests']} requests sent again after their connection "
                f"closed before any answer ({printable(redact(rs['example']))}): a "
                "keep-alive connection the server had already closed", style="dim"))
        if r.get("client_lagged"):
            out.print(Text(f"warning{at}: {printable(r['client_lagged'])}", style="yellow"))
        if ud := r.get("usage_distrusted"):
            out.print(Text(
                f"warning{at}: the server's usage counts were not believed for "
                f"{ud['requests']} requests ({printable(ud['example'])}); token "
                "throughput counts text chunks for those", style="yellow"))


def render_bench(res: dict[str, Any]) -> None:
    wl = res["workload"]
    out.print(f"{', '.join(res['urls'])}  model {', '.join(res['models'])}  "
              f"in {wl['input_len']} out {wl['output_len']}"
              + (f"  SLO {', '.join(res['slo'])}" if res["slo"] else ""))
    _bench_warnings(res)
    if "capacity" in res:
        c = res["capacity"]
        t = Table(title="capacity search")
        for col in ("load", "ok", "why", "ttft_p99", "tpot_p99", "e2e_p99", "throughput"):
            t.add_column(col)
        t.add_column("requests")
        t.add_column("prefix hits")
        for st in c["steps"]:
            hit = st.get("prefix_cache_hit_rate")
            t.add_row(f"{st['load']:g}", "yes" if st["ok"] else "no", st["why"],
                      *[_fmt(st.get(k)) for k in ("ttft_p99", "tpot_p99", "e2e_p99",
                                                   "throughput")],
                      str(st.get("requests", "-")), "-" if hit is None else f"{hit:.1%}")
        out.print(t)
        if c.get("found"):
            hi = c["bracket"][1]
            out.print(f"capacity under SLO: {c['value']:.3g} {c.get('unit', '')} "
                      f"(bracket {c['bracket'][0]:.3g} .. "
                      f"{'open' if hi is None else format(hi, '.3g')})")
            if c.get("decided"):
                out.print(f"  decided: {c['decided']}")
            if (v := VerdictCapacity.from_dict(c.get("from_verdicts"))) is not None:
                out.print(f"  every probe's verdict as a noisy one: {v.text(c.get('unit', ''))}")
            if c.get("window_s"):
                out.print(f"  each probe ran at least {c['window_s']:.0f} s of arrivals "
                          f"(10 service times of {_fmt((c.get('service_s') or 0) * 1000)} ms,"
                          " at least the --capacity-window); a load holds when its SLO is "
                          "met, the server serves the offered rate and its queue does not "
                          "grow")
        else:
            out.print(Text(f"no capacity found: {c.get('reason', 'last re-measure failed')}",
                           style="red"))
        return
    if "repeats" in res:
        t = Table(title=f"{len(res['runs'][0])} runs: median [95% CI]")
        t.add_column("metric")
        for agg in res["repeats"]:
            t.add_column(agg["url"])
        if "comparison" in res:
            t.add_column("ratio 2nd/1st [95% CI]")
        from qtune.bench import KEY_METRICS

        for m in KEY_METRICS:
            cells = []
            for agg in res["repeats"]:
                a = agg.get(m)
                ci = a and a["ci95"]
                cells.append("-" if not a else f"{_fmt(a['median'])}"
                             + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else ""))
            if "comparison" in res:
                c = res["comparison"].get(m)
                cells.append("-" if not c else f"{c['ratio']:.3f}" + (
                    f" [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]" if c["ci95"] else ""))
            t.add_row(m, *cells)
        out.print(t)
        return
    out.print(_summary_table("measurement", [("", res)]))
    if res.get("goodput"):
        g = res["goodput"]
        out.print(f"goodput: {g['good_share']:.1%} of requests met every per-request "
                  f"limit; {g['request_goodput']:.2f} good req/s; percentile SLOs "
                  + ("met" if g["slo_met"] else "MISSED"))
    if res.get("server"):
        sv = res["server"]
        hit = sv["prefix_cache_hit_rate"]
        kv = sv.get("kv_cache_usage_peak")
        pre = sv.get("preemptions")
        out.print(f"server: {'-' if pre is None else pre} preemptions, KV cache peak "
                  + ("-" if kv is None else f"{_fmt(kv * 100)}%")
                  + f", waiting peak {_fmt(sv.get('waiting_peak'))}, prefix-cache hit rate "
                  + ("-" if hit is None else f"{hit:.1%}")
                  + (" (cache emptied before the run)" if res.get("cache_reset") else "")
                  + f"; in flight at most {res.get('held_peak', '-')} (client count)")
        if uneven := _uneven_replicas(sv):
            out.print(uneven)


# Below this many finished requests per engine, or this many in flight at
# the busiest one, the luck of the Poisson split moves the peaks by itself.
_MIN_REQUESTS_PER_ENGINE = 100
_MIN_HELD_PEAK = 16


def _uneven_replicas(sv: dict[str, Any] | None) -> str | None:
    """A line when one data-parallel engine held far more requests at once
    (running or waiting) than another over a run long enough to tell: the
    front end splits by arrival, so a slower replica (its GPU, a neighbour)
    builds a queue, and the trial's tail latency is likely that replica's.
    Measured on 2xH200: 142/52 running in the start whose p99 was 2.7x the
    others', 47/49 normally."""
    bal = (sv or {}).get("held_balance")
    if sv is None or bal is None or bal >= 2 / 3:
        return None
    engines = sv["engines"]
    if min(e.get("requests", 0) for e in engines) < _MIN_REQUESTS_PER_ENGINE or \
            max(e["held_peak"] for e in engines) < _MIN_HELD_PEAK:
        return None
    peaks = "/".join(f"{e['held_peak']:.0f}" for e in engines)
    return (f"replicas uneven: requests held (running + waiting) per engine peaked at {peaks} "
            "(one replica drains slower: its GPU, a neighbour on it, or the split)")


def render_verify(res: Mapping[str, Any]) -> None:
    other = res["against"]
    t = Table(title=f"verify {res['profile']}: {res['repeats']} starts each, "
                    f"median [95% CI]")
    t.add_column("metric")
    t.add_column("profile")
    t.add_column(other)
    t.add_column("gain (>1: profile better) [95% CI]")
    for m, row in res["metrics"].items():
        def cell(d: dict[str, Any]) -> str:
            ci = d["ci95"]
            return _fmt(d["median"]) + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")

        g = row["gain"]
        gain = f"{g['ratio']:.2f}x" + (
            f" [{g['ci95'][0]:.2f}, {g['ci95'][1]:.2f}]" if g["ci95"] else "")
        t.add_row(m, cell(row["profile"]), cell(row[other]), gain)
    out.print(t)
    if res.get("note"):
        out.print(f"note: {res['note']}")
    for side, why in (res.get("failed_starts") or {}).items():
        if why:
            out.print(f"{side}: {len(why)} of {res['repeats']} starts failed "
                      f"({'; '.join(sorted(set(why)))}): its figures are from the rest")
    if res.get("slo_met") is not None:
        out.print("SLO " + ", ".join(res["slo"]) + ": met in " + ", ".join(
            f"{n} of {len(res['startup_s'][side])} {side} runs"
            for side, n in res["slo_met"].items()))
    judged = res.get("judged_by", res["objective"])
    g = res["metrics"].get(judged, {}).get("gain")
    what = res["objective"] + (f" (judged by {judged}" + (
        f" at {res['at_load']}" if res.get("at_load") else "") + ")"
        if judged != res["objective"] else "")
    if g and g["ci95"]:
        verdict = ("confirmed" if g["ci95"][0] > 1 else
                   "not confirmed (interval includes 1)" if g["ci95"][1] >= 1 else
                   "REVERSED: the other side is better")
        out.print(f"{what}: gain {g['ratio']:.2f}x, {verdict}")
    elif g:
        out.print(f"{what}: gain {g['ratio']:.2f}x (no interval under 3 starts a side: "
                  "--repeat 3 or more gives one)")
    else:
        out.print(Text(f"{what}: no verdict: neither side gave a value", style="red"))


def warn(line: str) -> None:
    """One warning line on stderr (what qtune noticed; nothing stops)."""
    err.print(Text("warning: " + printable(line), style="yellow"), soft_wrap=True)


def render_check(res: Mapping[str, Any]) -> None:
    cfg = res["config"]
    t = Table(title=f"check {res['profile']} against {res['url']} ({res['served']})")
    for col in ("setting", "tuned", "running", "read from"):
        t.add_column(col)
    differ = {d["what"]: d for d in cfg["differ"]}
    for d in cfg["differ"]:
        t.add_row(Text(d["what"], style="red"), str(d["tuned"]), str(d["running"]),
                  d["source"])
    for name in cfg["checked"]:
        if name not in differ:
            t.add_row(name, "=", "=", "")
    out.print(t)
    if cfg["not_checked"]:
        out.print("not reported by the server, not checked: " + ", ".join(cfg["not_checked"]))
    if res.get("tokenizer_warning"):
        out.print(Text("warning: " + res["tokenizer_warning"], style="yellow"))
    # A Pareto point is judged on both its coordinates ("compared").
    for c in res.get("compared") or ([res["compare"]] if res.get("compare") else []):
        out.print(f"{c['metric']}: now {_fmt(c['now'])}, tuned {_fmt(c['tuned'])} "
                  f"({c['tuned_from']}), noise {c['noise']:.0%}")
    style = "green" if res["exit_code"] == 0 else "red"
    out.print(Text(res["verdict"], style=style))


def _number(v: Any) -> float | None:
    """A table cell's number: None for a gap (pandas' NaN) or no number."""
    return float(v) if isinstance(v, (int, float)) and v == v else None


def render_report(res: dict[str, Any]) -> None:
    # On a narrow terminal (or an 80-column pipe) a params column would wrap
    # one word per line: the params and reasons go below the table instead.
    wide = out.width >= 140
    # The title says what the value is and the units ("value" beside "req/s"
    # read 26.4 against 24.3 with nothing to say which was which); the
    # headers stay short enough for 80 columns with the quality column.
    objective = str(res["objective"])
    unit = ((res.get("recommendation") or {}).get("figure") or {}).get("unit")
    what = f"value: {objective}" + (f" in {unit}" if unit else "")
    t = Table(title=f"study {res['study']} ({what}; latencies in ms; served: completed "
              "requests per second)", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("trial", "status", "value", "ttft p99", "tpot p99", "e2e p99", "served"):
        t.add_column(col, no_wrap=True)
    # The quality gate's loss (perplexity rise over the engine defaults'),
    # where a trial was scored on real weights.
    scored = any(_number(r.get("quality_loss")) is not None for r in res["trials"])
    if scored:
        t.add_column("quality", no_wrap=True)
    # Speculative decoding's acceptance rate, where a trial drafted.
    drafted = any(_number(r.get("spec_acceptance")) is not None for r in res["trials"])
    if drafted:
        t.add_column("accept", no_wrap=True)
    if wide:
        t.add_column("params / reason")
    below = []
    for r in res["trials"]:
        # pandas turns an int column with gaps into floats: 11.0 -> 11.
        params = ", ".join(
            f"{k[6:]}={int(v) if isinstance(v, float) and v.is_integer() else v}"
            for k, v in r.items() if k.startswith("param.") and v == v and v is not None)
        what = params
        if r["baseline"]:
            what = f"engine defaults ({params})" if params else "engine defaults"
        if isinstance(r.get("engine"), str):  # --engine a,b
            what = f"{r['engine']}: {what}"
        if r["status"] not in ("ok",) or r.get("reason") == "quality_loss":
            why = "" if r["reason"] == r["status"] else f"{r['reason']}: "
            what = f"{why}{clip(str(r['detail']), 300)}" if r["detail"] else what
        loss = _number(r.get("quality_loss"))
        quality = [] if not scored else ["-" if loss is None else f"{loss * 100:+.2f}%"]
        acc = _number(r.get("spec_acceptance"))
        if drafted:
            quality.append("-" if acc is None else f"{acc:.0%}")
        style = "green" if r["trial"] == res["best_trial"] else (
            "" if r["status"] == "ok" else "dim")
        t.add_row(str(r["trial"]) + (" (base)" if r["baseline"] else ""), r["status"],
                  _fmt(r["value"]), _fmt(r["ttft_p99_ms"]), _fmt(r["tpot_p99_ms"]),
                  _fmt(r["e2e_p99_ms"]), _fmt(r["req_per_s"]), *quality,
                  *([what] if wide else []),
                  style=style)
        below.append(Text(f"{r['trial']:>4}  {what}", style=style))
    out.print(t)
    if not wide:
        out.print(Text("trial  params / reason", style="bold"))
        for line in below:
            out.print(line)
    if res.get("speculative"):
        out.print(f"speculative decoding: {res['speculative']}")
    if res.get("engines"):
        _render_engines(res["engines"])
    if res["importances"]:
        out.print("importance: " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(res["importances"].items(),
                                              key=lambda kv: -kv[1])))


def render_recommendation(rec: dict[str, Any]) -> None:
    """The report's first screen (``qtune.recommendation``): what to run,
    its figure against the engine defaults, on what, the quality verdict
    and the command that deploys it.  Plain text, no markup: flags carry
    brackets and the study's strings are not ours."""
    out.print(Text("Recommendation", style="bold"))
    out.print(Text(printable(rec["headline"]), style="green" if rec["trial"] is not None
                   else "red"), soft_wrap=False)
    if rec["trial"] is None:
        return
    if rec["kept_defaults"]:
        out.print(Text("  config:    the engine defaults (nothing to change)"))
    elif rec["flags"]:
        out.print(Text(printable(f"  config:    trial {rec['trial']}: "
                                 + " ".join(rec["flags"]))))
    f = rec.get("figure")
    if f:
        # (here, not at the top: it brings in Optuna, ~0.3 s on every command)
        from qtune.recommendation import value_text

        gain = f"{f['ratio']:.2f}x" if f.get("ratio") is not None else "no ratio"
        interval = ""
        if f.get("interval"):
            lo, hi = f["interval"]
            interval = f" [{lo:.2f}, {'inf' if hi is None else f'{hi:.2f}'}]"
        out.print(Text(f"  figure:    {f['metric']} {value_text(f['best'], f['unit'])} against "
                       f"the defaults' {value_text(f['baseline'], f['unit'])}: {gain}{interval} "
                       f"({f['basis']})"))
        out.print(Text(printable("  confirmed: " + (
            "yes, on fresh starts" if f["confirmed"] else f"no: {f['why_not_confirmed']}")),
                       style="" if f["confirmed"] else "yellow"))
        if f.get("bracket"):
            held, failed = f["bracket"]
            out.print(Text(f"  bracket:   held {held:g} {f['unit']}, failed at "
                           + ("none above it" if failed is None else f"{failed:g}")))
        if (v := VerdictCapacity.from_dict(f.get("from_verdicts"))) is not None:
            out.print(Text(f"  verdicts:  {v.text(f['unit'])}"))
        if f.get("decided"):
            out.print(Text(printable(f"  decided:   {f['decided']}")))
    if rec.get("slo"):
        basis = f"({rec['slo_basis']}) " if rec.get("slo_basis") else ""
        out.print(Text(printable("  slo:       " + basis + "; ".join(rec["slo"]))))
    on = rec["measured_on"]
    out.print(Text(printable(f"  measured:  {on['accelerator']}, {on['engine']}, "
                             f"model {on['model']}")))
    out.print(Text(printable(f"  workload:  {on['workload']}")))
    if on.get("ran"):
        out.print(Text(printable(f"  ran:       {on['ran']}")))
    out.print(Text(printable(f"  quality:   {rec['quality']}")))
    if rec.get("emit_command"):
        # One line, never wrapped: it is pasted whole.
        out.print(Text("  deploy:    " + rec["emit_command"]), soft_wrap=True)
        if rec.get("emit_why"):
            out.print(Text("             " + rec["emit_why"]), soft_wrap=True)
    out.print()
