"""Helpers shared by the benchmark scripts (not part of qtune)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

AGREEMENT = 0.05  # |qtune/vllm - 1| within this is "agreement"


_last_seen = float("-inf")  # monotonic time another vLLM server was last seen


def other_vllm_servers(own: Iterable[int] = ()) -> list[int]:
    """PIDs of vLLM API servers that are not ours (``pgrep -f vllm.entrypoints``)."""
    global _last_seen
    res = subprocess.run(
        ["pgrep", "-f", "vllm.entrypoints"], capture_output=True, text=True
    )
    skip = set(own) | {os.getpid()}
    pids = [int(p) for p in res.stdout.split() if int(p) not in skip]
    if pids:
        _last_seen = time.monotonic()
    return pids


def wait_until_alone(
    own: Iterable[int] = (), timeout: float = 3600.0, quiet: float = 0.0
) -> float:
    """Block until no other vLLM server runs and none has been seen for
    ``quiet`` seconds (a test suite starts servers back to back); returns
    seconds waited."""
    own = set(own)
    t0 = time.monotonic()
    said = False
    while True:
        pids = other_vllm_servers(own)
        now = time.monotonic()
        if not pids and now - _last_seen >= quiet:
            break
        if now - t0 > timeout:
            sys.exit(f"another vLLM server still runs after {timeout:.0f} s: {pids}")
        if pids and not said:
            print(f"  waiting: another vLLM server runs (pids {pids}) ...", flush=True)
            said = True
        time.sleep(1 if not pids else 3)
    waited = time.monotonic() - t0
    if said:
        print(f"  ... free after {waited:.0f} s", flush=True)
    return waited


def pct(values: Iterable[float], p: float) -> float | None:
    arr = np.fromiter(values, dtype=float)
    return float(np.percentile(arr, p)) if arr.size else None


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def verdict(r: float | None, tol: float = AGREEMENT) -> str:
    if r is None:
        return "n/a"
    return "agree" if abs(r - 1.0) <= tol else f"DIFF {100 * (r - 1):+.1f}%"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    line = lambda r: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


class Monitor:
    """Watches one measurement run for interference.

    ``intruders``: other vLLM API servers seen while the run went (polled
    every ``every`` s).  ``foreign_cpu``: CPU-seconds the machine spent
    outside this process and the process trees in ``own_roots`` during the
    run, as a share of wall time times cores.
    """

    def __init__(self, own_roots: Iterable[int] = (), every: float = 1.0) -> None:
        import threading

        self.own_roots = list(own_roots)
        self.every = every
        self.intruders: set[int] = set()
        self.foreign_cpu = 0.0
        self.top_foreign: list[tuple[str, float]] = []  # (command, CPU s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _own_procs(self):
        import psutil

        procs = [psutil.Process()]
        for pid in self.own_roots:
            try:
                root = psutil.Process(pid)
                procs += [root] + root.children(recursive=True)
            except psutil.Error:
                pass
        return procs

    def _own_cpu(self) -> float:
        import psutil

        tot = 0.0
        for p in self._own_procs():
            try:
                t = p.cpu_times()
                tot += t.user + t.system
                if p.pid == os.getpid():  # our reaped children (pgrep polls)
                    tot += t.children_user + t.children_system
            except psutil.Error:
                pass
        return tot

    @staticmethod
    def _busy() -> float:
        import psutil

        t = psutil.cpu_times()
        return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)

    def _poll(self) -> None:
        own = {p.pid for p in self._own_procs()}
        while not self._stop.wait(self.every):
            self.intruders.update(other_vllm_servers(own))

    @staticmethod
    def _all_cpu() -> dict[int, tuple[str, float]]:
        import psutil

        out = {}
        for p in psutil.process_iter(["cmdline", "name", "cpu_times"]):
            t = p.info["cpu_times"]
            if t is None:
                continue
            cmd = " ".join(p.info["cmdline"] or []) or p.info["name"] or "?"
            out[p.pid] = (cmd, t.user + t.system)
        return out

    def __enter__(self) -> Monitor:
        self._t0 = time.monotonic()
        self._procs0 = self._all_cpu()
        self._busy0, self._own0 = self._busy(), self._own_cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        wall = time.monotonic() - self._t0
        foreign = (self._busy() - self._busy0) - (self._own_cpu() - self._own0)
        self.foreign_cpu = max(0.0, foreign) / max(1e-9, wall * (os.cpu_count() or 1))
        own = {p.pid for p in self._own_procs()}
        deltas = []
        for pid, (cmd, cpu) in self._all_cpu().items():
            if pid in own:
                continue
            d = cpu - self._procs0.get(pid, (cmd, 0.0))[1]
            if d > 0.05:
                deltas.append((cmd[:70], d))
        self.top_foreign = sorted(deltas, key=lambda x: -x[1])[:3]

    def describe(self) -> str:
        if not self.top_foreign:
            return ""
        return "; ".join(f"{c} {d:.1f} s" for c, d in self.top_foreign)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def launch(model: str | None, params: dict[str, object], work: Path) -> Any:
    """The engine's server for ``model`` (None: the embedded one) with ``params``
    ({} = the engine's own defaults), described by qtune's vLLM adapter.

    Returns ``(Server, spec, tokenizer_dir)``; the caller enters the Server.
    """
    from qtune.engines import probe_host as probe
    from qtune.engines import trial_spec
    from qtune.engines.base import SpaceContext
    from qtune.engines.vllm import VLLM
    from qtune.model import resolve_model
    from qtune.server import Server, free_port

    m = resolve_model(model)
    host = probe()
    ctx = SpaceContext(host, m, host.engines.get("vllm"))
    eng = VLLM()
    spec = trial_spec(eng, params or eng.baseline(ctx)[0], ctx, free_port())
    return Server(spec, work / "server.log"), spec, str(m.tokenizer_dir)


def fifo(rate: float, until_s: float, slots: int, service_s: float, seed: int, *,
         jitter: float = 0.0, from_s: float = 0.0) -> list[Any]:
    """A simulated first-come-first-served server of ``slots`` slots: Poisson
    sends at ``rate`` until ``until_s``, each served in ``service_s`` (times
    ``uniform(1 - jitter, 1 + jitter)`` when ``jitter``), as qtune's client
    would record them (``RequestSample``s; TTFT is the wait plus 50 ms); the
    requests sent before ``from_s`` fill the queue and are left out."""
    import random

    from qtune.load.client import RequestSample

    rng = random.Random(seed)
    free = [0.0] * slots
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= until_s:
            return out
        k = min(range(slots), key=free.__getitem__)
        begin = max(t, free[k])
        free[k] = begin + service_s * (rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0)
        if t >= from_s:
            out.append(RequestSample(start=t, ttft=begin - t + 0.05, e2e=free[k] - t,
                                     output_tokens=8))


def set_server_nice(pid: int, nice: int) -> None:
    """The autogroup nice of the server's session (qtune starts a server in a
    session of its own). Linux's CFS shares CPU between autogroups first, so
    a process's own nice would not weigh against the client's group. On the
    2-vCPU VM the client's loop waited for a core 2-5 s at a time beside the
    server; with the server's group at nice 10 it was at most 3 ms late, and
    the server's e2e p50 rose 37% at 16 req/s
    (benchmarks/results/client-lag-cpu-20261207)."""
    Path(f"/proc/{pid}/autogroup").write_text(str(nice))
