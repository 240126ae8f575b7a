#!/usr/bin/env python3
"""Measure the table that ``replay_search.py`` replays the search against.

Every config of a small grid (``max_num_seqs`` x ``max_num_batched_tokens``,
plus the engine defaults, which every search launches first) is started
``--starts`` times afresh, in rounds (each round every config once, the
order rotated by one config a round, so a drift of the machine over the
session is spread over the configs), and measured exactly as a search
trial measures: the same ``qtune.search.prepare`` (space file, fixed
params, the engine's launch command) and ``qtune.measure.measure_server``
with the trial's ``bench_config``.  Each run gets its own prompts (the
workload seed changes per run), so no config is judged on one set of
prompts.

Besides each run's summary (as a study stores it) it keeps every request's
send time, TTFT, E2E and token counts: the replay feeds those to qtune's
own pruner, so a replayed trial is pruned where the live one would have
been.

The exclusive CPU lock (``--lock``, ``/tmp/qtune-cpu.lock``) is held for one
config's start and measurement only, and released between configs so that
other users of the 2 shared cores can run.

    python benchmarks/replay_table.py [--starts 3] [--requests 300] [--out DIR]

Writes ``runs.jsonl`` (one line per run, appended as it goes), ``meta.json``
(what was measured and how: the table is both files, ``qtune.search.replay.
Table.load`` reads them) and the server logs under ``logs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

import qtune.bench as qbench  # noqa: E402
from qtune.errors import ServerError  # noqa: E402
from qtune.load.workload import Workload  # noqa: E402
from qtune.measure import measure_server  # noqa: E402
from qtune.search.config import TuneConfig  # noqa: E402
from qtune.search.inputs import prepare  # noqa: E402
from qtune.search.replay import TABLE_VERSION, config_key, sample_record  # noqa: E402
from qtune.search.trial import bench_config  # noqa: E402
from qtune.server import free_port  # noqa: E402


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[float]:
    """Hold the shared CPU lock exclusively; yields the seconds waited."""
    t0 = time.monotonic()
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def space_yaml(seqs: list[int], mnbt: list[int], kv: int) -> str:
    return "\n".join([
        "# written by benchmarks/replay_table.py",
        f"max_num_seqs: {seqs}", f"max_num_batched_tokens: {mnbt}",
        f"VLLM_CPU_KVCACHE_SPACE: {kv}",
        "enable_chunked_prefill: true", "enable_prefix_caching: false"]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="4,8,16,32")
    ap.add_argument("--mnbt", default="256,1024,4096,16384")
    ap.add_argument("--kv", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE GiB (2)")
    ap.add_argument("--starts", type=int, default=3, help="fresh starts per config (3)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--objective", default="e2e_p50")
    ap.add_argument("--lock", type=Path, default=Path("/tmp/qtune-cpu.lock"))
    ap.add_argument("--max-minutes", type=float, default=40.0,
                    help="start no new run once the runs took this long, waits for "
                    "the lock not counted (the order is by round, so a cut leaves "
                    "every config with the same starts but the last round's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    seqs = [int(v) for v in args.seqs.split(",")]
    mnbt = [int(v) for v in args.mnbt.split(",")]
    out = args.out or REPO / "benchmarks" / "results" / \
        f"replay-table-{dt.datetime.now():%Y%m%d-%H%M%S}"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    space = out / "space.yaml"
    space.write_text(space_yaml(seqs, mnbt, args.kv))
    wl = Workload(input_len=args.input_len, output_len=args.output_len,
                  concurrency=args.concurrency, requests=args.requests,
                  warmup_requests=args.warmup)
    tmp = Path(tempfile.mkdtemp(prefix="replay-table-"))
    prep = prepare(TuneConfig(engine="vllm", workload=wl, objective=args.objective,
                              space_file=space, study="replay-table",
                              studies_dir=tmp / "studies", profiles_dir=tmp / "profiles"))
    base_params, _ = prep.engine.baseline(prep.ctx)
    configs: list[tuple[str, dict[str, Any]]] = [("defaults", {**base_params, **prep.fixed})]
    for s, b in itertools.product(seqs, mnbt):
        configs.append((f"seqs{s}-mnbt{b}",
                        {"max_num_seqs": s, "max_num_batched_tokens": b, **prep.fixed}))
    tuned = [p.name for p in prep.params]

    table = {
        "version": TABLE_VERSION,
        "engine": f"{prep.ctx.install.name} {prep.ctx.install.version} "
                  f"({prep.ctx.install.build})",
        "model": prep.ctx.model.summary(),
        "objective": args.objective,
        "direction": prep.direction,
        "tuned": tuned,
        "space": {"max_num_seqs": seqs, "max_num_batched_tokens": mnbt},
        "fixed": prep.fixed,
        "workload": wl.to_dict(),
        "how": (f"each config started {args.starts} times afresh, in rounds (order rotated "
                "a round), measured by qtune.measure.measure_server with the search trial's "
                "bench_config; workload seed 1000*(round+1)+config index (fresh prompts per "
                f"run); exclusive {args.lock} held per run only"),
        "host": {"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total
                                                               / 2**30, 1)},
        "wall_min": None,
    }
    (out / "meta.json").write_text(json.dumps(table, indent=1) + "\n")
    t_start = time.monotonic()
    measured_s = 0.0  # time holding the lock
    captured: list[Any] = []
    real_summarize = qbench.summarize

    def keep(samples: list[Any], duration: float) -> dict[str, Any]:
        captured[:] = [list(samples)]
        return real_summarize(samples, duration)

    qbench.summarize = keep  # the run's requests, as the summary saw them
    runs_path = out / "runs.jsonl"
    n_runs = 0
    for rnd in range(args.starts):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for name, params in order:
            if measured_s > args.max_minutes * 60:
                break
            seed = 1000 * (rnd + 1) + configs.index((name, params))
            run_wl = Workload(**{**{k: getattr(wl, k) for k in (
                "input_len", "output_len", "concurrency", "requests", "warmup_requests")},
                "seed": seed})
            spec = prep.engine.launch_spec(params, prep.ctx, host="127.0.0.1",
                                           port=free_port())
            log = out / "logs" / f"{name}-r{rnd}.log"
            row: dict[str, Any] = {"config": name, "key": config_key(params, tuned),
                                   "params": params, "round": rnd, "workload_seed": seed}
            with exclusive(args.lock) as waited:
                held = time.monotonic()
                cpu0 = psutil.cpu_times()
                row["lock_wait_s"] = round(waited, 1)
                row["started"] = dt.datetime.now().isoformat(timespec="seconds")
                row["loadavg_before"] = os.getloadavg()[0]
                try:
                    m = measure_server(spec, log, bench_config(prep, spec, run_wl),
                                       startup_timeout=600, classify=prep.engine.classify)
                except ServerError as exc:
                    row["error"] = f"{exc.reason}: {exc.message}"
                    m = None
                cpu1 = psutil.cpu_times()
                measured_s += time.monotonic() - held
            busy = sum(cpu1) - sum(cpu0)
            row["steal_share"] = round((getattr(cpu1, "steal", 0.0)
                                        - getattr(cpu0, "steal", 0.0)) / busy, 4) if busy else 0.0
            if m is not None:
                row["summary"] = m.to_dict()
                row["startup_s"], row["measure_s"] = m.startup_s, m.measure_s
                samples = captured[0] if captured else []
                t0 = min((s.start for s in samples), default=0.0)
                row["samples"] = [sample_record(s, t0) for s in samples]
                e2e = (m.e2e_ms or {}).get("p50")
                print(f"round {rnd} {name}: e2e p50 {e2e:.1f} ms, start "
                      f"{m.startup_s:.1f} s, measure {m.measure_s:.1f} s, "
                      f"lock wait {waited:.0f} s", flush=True)
            else:
                print(f"round {rnd} {name}: {row['error']}", flush=True)
            with runs_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            n_runs += 1
    qbench.summarize = real_summarize
    table["wall_min"] = round((time.monotonic() - t_start) / 60, 1)
    (out / "meta.json").write_text(json.dumps(table, indent=1) + "\n")
    print(f"{n_runs} runs in {table['wall_min']} min: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
