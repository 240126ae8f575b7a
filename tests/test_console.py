"""Console lines that carry a finding, not just figures."""

from __future__ import annotations

from qtune.console import _uneven_replicas


def test_uneven_replicas_are_named_even_ones_are_not():
    # 2xH200, run 5's slow start (vLLM's own stats lines) and run 6's trial 1.
    engines = [{"engine": "0", "held_peak": 142.0, "requests": 400},
               {"engine": "1", "held_peak": 52.0, "requests": 400}]
    line = _uneven_replicas({"engines": engines, "held_balance": 52 / 142})
    assert line == ("replicas uneven: requests held (running + waiting) per engine "
                    "peaked at 142/52 (one replica drains slower: its GPU, a neighbour "
                    "on it, or the split)")
    even = [dict(e, held_peak=p) for e, p in zip(engines, (47.0, 49.0), strict=True)]
    assert _uneven_replicas({"engines": even, "held_balance": 47 / 49}) is None
    assert _uneven_replicas({"preemptions": 0}) is None  # one engine
    # Too few requests per engine, or a light load: the split alone can do that.
    few = [dict(e, requests=40) for e in engines]
    assert _uneven_replicas({"engines": few, "held_balance": 0.37}) is None
    light = [dict(e, held_peak=p) for e, p in zip(engines, (9.0, 3.0), strict=True)]
    assert _uneven_replicas({"engines": light, "held_balance": 1 / 3}) is None
    assert _uneven_replicas(None) is None  # no /metrics


def test_verify_names_the_starts_that_failed(monkeypatch):
    import io

    import qtune.console as console

    buf = io.StringIO()
    # A console of the same kind that writes to a buffer (rich is imported in
    # qtune/console.py only).
    monkeypatch.setattr(console, "out", type(console.out)(file=buf, width=200))
    row = {"median": 2.0, "ci95": [1.9, 2.1], "values": [1.9, 2.0, 2.1]}
    console.render_verify({
        "profile": "p", "against": "defaults", "repeats": 3, "objective": "e2e_p99",
        "metrics": {"e2e_p99": {"profile": row, "defaults": dict(row, median=6.0),
                                "gain": {"ratio": 3.0, "ci95": [2.8, 3.2]}}},
        "failed_starts": {"profile": ["oom: CUDA out of memory"], "defaults": []},
    })
    text = buf.getvalue()
    assert ("profile: 1 of 3 starts failed (oom: CUDA out of memory): its figures "
            "are from the rest") in text
    assert text.count("starts failed") == 1  # the side whose starts all ran: no line
    assert "e2e_p99: gain 3.00x, confirmed" in text


def test_an_overloaded_trial_says_so_beside_its_figures(monkeypatch):
    """The H200 SGLang study's trial 1 (40 req/s offered, ~26 served): its
    line carries the overload and what it means for the latency."""
    import io
    from types import SimpleNamespace

    import qtune.console as console
    from qtune.metrics import OVERLOAD_MEANS

    buf = io.StringIO()
    monkeypatch.setattr(console, "err", type(console.err)(file=buf, width=400))
    why = "served 25.70 of 40.00 req/s over the arrival window"
    summary = {"e2e_ms": {"p99": 11399.1}, "ttft_ms": {"p50": 4815.0, "p99": 9545.6},
               "request_throughput": 25.91, "failed": 0, "duration_s": 30.9,
               "warmup_s": 7.7, "overloaded": why}
    rec = SimpleNamespace(status="ok", server_of=None, total_s=112.0, baseline=False,
                          load_level=None, params={"max_running_requests": 53},
                          feasible=True, value=11399.1, values=None, summary=summary,
                          startup_s=65.0, quality=None, number=1, reason=None, detail=None,
                          start_phases=None)
    rep = console.SearchReporter("e2e_p99")  # not entered: no live status line
    rep.trial_done(rec, rec)
    text = " ".join(buf.getvalue().split())
    assert f"overloaded: {why}: {' '.join(OVERLOAD_MEANS.split())}" in text
    summary.pop("overloaded")
    buf.truncate(0)
    rep.trial_done(rec, rec)
    assert "overloaded" not in buf.getvalue()
