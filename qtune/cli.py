"""Command line: parse, build one config, call one entrypoint, render.

Errors are caught once, in ``main``: a ``QtuneError`` prints one line and a
hint and exits 1 (2 for usage errors from Typer); ``--debug`` shows the
traceback instead.  Human output goes to stderr, ``--json`` to stdout.

Over 500 lines: one Typer command per qtune command (their options are the
help people read, so they stay next to the command), each only parsing and
calling one entrypoint; the option groups live in ``cli_options`` and
``qtune.options``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from qtune import __version__
from qtune.cli_options import (
    CAPACITY,
    CONFIRM,
    FLEET,
    NOT_GIVEN,
    QUALITY,
    EnginePython,
    FilledCommand,
    Force,
    HelpCommand,
    HelpGroup,
    LoadOptions,
    SloOpt,
    with_load_options,
    with_option_groups,
)
from qtune.errors import QtuneError, mask_url, redact
from qtune.options import CapacitySearch, Confirmation, Fleet, QualityGate

if TYPE_CHECKING:
    pass

_F = TypeVar("_F", bound=Callable[..., Any])


class _App(typer.Typer):
    """Every command gets ``HelpCommand`` unless it names its own class."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[_F], _F]:
        kwargs.setdefault("cls", HelpCommand)
        return super().command(*args, **kwargs)


app = _App(
    cls=HelpGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # locals may hold tokens; we render errors
    help="Tune an LLM inference server on this host, and deploy the winner.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
_state = {"debug": False, "json": False, "json_printed": False}


def _version(value: bool) -> None:
    if value:
        print(f"qtune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True,
                           help="Print qtune's version.")
    ] = False,
) -> None:
    _state["debug"] = debug
    from qtune import files

    files.reset()  # what the last command (in this process) read is not this one's input


def _print_json(obj: Any) -> None:
    # Strict (no NaN), then secrets by shape in every string (a server's
    # error text too).
    from qtune import jsonout
    from qtune.untrusted import redact_tree

    sys.stdout.write(jsonout.dumps(redact_tree(jsonout.strict(obj))) + "\n")
    _state["json_printed"] = True


def _json_mode(value: bool) -> bool:
    # Set while the arguments are read, so that main answers a failure
    # after it in JSON too.
    if value:
        _state["json"] = True
    return value


def _json_error(message: str, hint: str | None, code: int, kind: str) -> None:
    """A failed ``--json`` command's one object: a script reads ``error``
    (and ``exit_code``) instead of parsing stderr."""
    if not _state["json_printed"]:
        _print_json({"error": message, "hint": hint, "kind": kind, "exit_code": code})


JsonOut = Annotated[bool, typer.Option(
    "--json", callback=_json_mode, is_eager=True,
    help="Print one JSON object on stdout, also on failure (with error, hint "
    "and exit_code).")]


@app.command()
def probe(
    engine_python: EnginePython = None,
    json_out: JsonOut = False,
    capture: Annotated[
        Path | None,
        typer.Option(help="Copy the /sys and /proc files read (and GPU facts) "
                     "into this folder, e.g. for a bug report."),
    ] = None,
) -> None:
    """Report CPU, NUMA, memory, THP, GPUs and engines, with findings."""
    from qtune import console
    from qtune.engines import probe_host as do_probe
    from qtune.host import capture as do_capture

    if capture is not None:  # before the probe, not after it
        from qtune.files import check_dir_target

        check_dir_target(capture, "--capture")
    facts = do_probe(engine_python=engine_python)
    d = facts.to_dict()
    if capture is not None:
        n = do_capture(capture)
        console.err.print(f"captured {n} files into {capture}")  # (printed visibly)
    if json_out:
        _print_json(d)
    else:
        console.render_probe(d)


# -- workload options, shared by search and bench ---------------------------
# Help texts name their choices and defaults as {placeholders}, filled in from
# the library when help is shown (``FilledCommand``): the registries live in modules
# (Optuna's samplers, the engine adapters, the load client) that a command which
# does not need them should not pay to import.  Defaults are written "(default:
# N)" (``HelpCommand``): rich reads "[default N]" as a style tag and drops it.
@app.command(cls=FilledCommand)
@with_load_options
@with_option_groups
def search(
    model: Annotated[
        str | None,
        typer.Option(help="Model folder (config.json; weights optional) or a "
                     "Hugging Face id already in the local cache (default: "
                     "qtune's embedded tiny model)."),
    ] = None,
    engine: Annotated[str, typer.Option(help="Engine adapter: {engines}.")] = "vllm",
    engine_python: EnginePython = None,
    trials: Annotated[int, typer.Option(min=1, help="Server launches, "
                                        "including the defaults baseline.")] = 10,
    load: LoadOptions = NOT_GIVEN,  # the workload options: with_load_options
    objective: Annotated[
        str, typer.Option(help="{objectives}")
    ] = "e2e_p99",
    slo: SloOpt = None,
    space: Annotated[
        Path | None, typer.Option(help="YAML file narrowing or fixing parameters.")
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (resumes if it exists).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="Optuna storage URL (default: a journal file under "
                     "studies/). A fleet's workers share postgresql://..., or "
                     "grpc://HOST:PORT of qtune storage-proxy."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o",
                                  help="Profile path (default: profiles/<study>.yaml).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="Pass --max-model-len to the engine.")
    ] = None,
    startup_timeout: Annotated[
        float, typer.Option(help="Seconds a server may take to become ready.")
    ] = 600.0,
    sampler: Annotated[str, typer.Option(
        help="{samplers}")] = "tpe",
    time_budget: Annotated[float | None, typer.Option(
        help="Minutes for the whole study; no trial starts that would not fit.")] = None,
    no_memory_check: Annotated[bool, typer.Option(
        "--no-memory-check", help="Launch configs predicted not to fit in memory "
        "(by default they are skipped: recorded, not launched).")] = False,
    memory_check_on: Annotated[bool, typer.Option(  # the default, kept for old scripts
        "--memory-check", hidden=True)] = False,
    pick: Annotated[int | None, typer.Option(
        help="Write the profile of this trial (e.g. a point of the Pareto front) "
        "instead of the best; with --study, of a finished study.")] = None,
    levels: Annotated[str | None, typer.Option(
        help="With --objective pareto: loads to measure each launched config at, "
        "on its one server, e.g. 2,4,8 (streams, or req/s with --rate; they "
        "replace the single load); each is a point of the front.")] = None,
    sampler_seed: Annotated[int | None, typer.Option(
        help="Seed of the sampler alone (default: --seed), to vary the search "
        "over the same workload.")] = None,
    prune_margin: Annotated[float, typer.Option(
        min=0.0, max=1.0,
        help="Stop a trial's measurement only once it is sure to miss the best so "
        "far by this fraction (0: exact). The best so far is one noisy run.")] = 0.1,
    speculative: Annotated[str, typer.Option(
        help="auto: after the search, try the engine's speculative decoding on the "
        "best config (real weights only) and keep it if it wins beyond the noise in "
        "interleaved repeats; off: never.")] = "auto",
    confirm: Confirmation = CONFIRM,  # with_option_groups: their options
    capacity: CapacitySearch = CAPACITY,
    quality: QualityGate = QUALITY,
    fleet: Fleet = FLEET,
    force: Force = False,
    json_out: JsonOut = False,
) -> None:
    """Tune the engine's launch flags against a live load; write a profile."""
    from qtune import console
    from qtune.objectives import parse_slo
    from qtune.search import prepare, run_study
    from qtune.search.config import TuneConfig, parse_levels
    wl = load.workload()
    cfg = TuneConfig(model=model, engine=engine, engine_python=engine_python,
                     trials=trials, workload=wl, objective=objective,
                     slo=parse_slo(slo), space_file=space, study=study,
                     storage=storage, out=out, max_model_len=max_model_len,
                     startup_timeout=startup_timeout,
                     seed=wl.seed if sampler_seed is None else sampler_seed, sampler=sampler,
                     time_budget=time_budget * 60 if time_budget else None,
                     memory_check=not no_memory_check, pick=pick,
                     levels=parse_levels(levels), prune_margin=prune_margin,
                     force=force, speculative=speculative, confirm=confirm,
                     capacity=capacity, quality=quality, fleet=fleet)
    prep = prepare(cfg)
    with console.SearchReporter(objective) as rep:
        res = run_study(prep, rep)
    if json_out:
        _print_json({
            "study": res.study_name,
            "storage": mask_url(res.storage),
            "profile": str(res.profile_path) if res.profile_path else None,
            "improvement": res.improvement,
            "memory_estimate": res.memory_estimate,
            "pruning": res.pruning,
            "stop_reason": res.stop_reason,
            "pareto_front": res.pareto_front,
            **({"engines": res.engines} if res.engines else {}),
            "best": _record(res.best) if res.best else None,
            "baseline": _record(res.baseline) if res.baseline else None,
            "trials": [_record(t) for t in res.trials],
        })
    else:
        console.render_search_result(res)
    if res.best is None:
        raise typer.Exit(3)


def _record(rec: Any) -> dict[str, Any]:
    """A trial as ``--json`` shows it; ``engine`` only in a study across
    engines (a study of one engine's output is as it was)."""
    return {k: v for k, v in rec.__dict__.items() if not (k == "engine" and v is None)}


@app.command(cls=FilledCommand)
@with_load_options
def bench(
    url: Annotated[list[str], typer.Option(
        help="Base URL of an OpenAI-compatible server; give two to compare.")],
    model: Annotated[str | None, typer.Option(
        help="Served model name (default: the first in /v1/models).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="Folder with tokenizer.json for exact prompt lengths.")] = None,
    engine: Annotated[str | None, typer.Option(
        help="The engine behind --url: its metric names, prefix-cache reset and "
        "fixed-length request fields (default: those vLLM and SGLang take).")] = None,
    load: LoadOptions = NOT_GIVEN,  # the workload options: with_load_options
    slo: SloOpt = None,
    repeat: Annotated[int, typer.Option(min=1, help="Measurements (interleaved "
                                        "across URLs); medians with 95% CI.")] = 1,
    find_capacity: Annotated[bool, typer.Option(
        "--find-capacity",
        help="Find the highest rate (or concurrency) that meets --slo and that "
        "the server keeps up with.")] = False,
    capacity_window: Annotated[float, typer.Option(
        min=1.0, max=3600.0, help="Shortest arrival window of a capacity probe, in "
        "seconds (each also runs at least 10 service times).")] = 20.0,
    capacity_tolerance: Annotated[float, typer.Option(
        min=0.01, max=1.0, help="Narrow the capacity's bracket [held, failed) to this "
        "fraction of it.")] = 0.1,
    no_metrics: Annotated[bool, typer.Option(
        "--no-server-metrics", help="Do not read the server's /metrics.")] = False,
    reset_prefix_cache: Annotated[bool, typer.Option(
        "--reset-prefix-cache",
        help="Empty the server's prefix cache before each measured run, where it "
        "offers that (vLLM with VLLM_SERVER_DEV_MODE=1, SGLang). Off by default: it "
        "changes a server qtune did not start. Runs use fresh prompts either way.")
    ] = False,
    gauge_interval: Annotated[float | None, typer.Option(
        min=0.0, max=3600.0, help="Read the server's gauges (running, waiting, KV use) "
        "every S seconds during the run, over a connection of their own; 0: counters "
        "only, before and after the run (default: 5 on a host with 8 or more CPUs, "
        "else 0: on 2 cores the reads slow the server measured).")] = None,
    csv: Annotated[Path | None, typer.Option(
        help="Write one row per run (or per capacity step) here.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the result here, as its suffix says: .json (the "
        "--json object) or .csv (as --csv).")] = None,
    force: Force = False,
    json_out: JsonOut = False,
) -> None:
    """Measure an OpenAI-compatible endpoint under a workload (no launch).
    Exits 3 when every request of a run failed (the reasons are printed)."""
    from qtune import console
    from qtune.bench import BenchConfig, check_url, default_gauge_interval, run_bench
    from qtune.objectives import parse_slo

    if len(url) > 2:
        from qtune.errors import InputError

        raise InputError("--url: give one endpoint, or two to compare",
                         hint="compare more configs pairwise")
    for u in url:
        check_url(u)
    json_file = None
    if out is not None:  # -o/--out: the one spelling; the format from the suffix
        from qtune.errors import InputError

        if out.suffix.lower() == ".json":
            json_file = out
        elif out.suffix.lower() != ".csv":
            raise InputError(f"-o {out}: cannot tell the format from "
                             f"{out.suffix or 'no suffix'}", hint="end it in .json or .csv")
        elif csv is not None:
            raise InputError(f"-o {out} and --csv {csv} both name the CSV file",
                             hint="give one of -o and --csv")
        else:
            csv = out
    if csv is not None or json_file is not None:  # before the first request
        from qtune.files import check_target

        for path, flag in ((csv, "--csv"), (json_file, "-o")):
            if path is not None:
                check_target(path, flag, force=force)
    wl = load.workload()
    cfg = BenchConfig(urls=url, workload=wl, model=model, tokenizer=tokenizer,
                      slo=parse_slo(slo), repeat=repeat, find_capacity=find_capacity,
                      scrape_metrics=not no_metrics, capacity_window=capacity_window,
                      capacity_tolerance=capacity_tolerance,
                      gauge_interval=default_gauge_interval() if gauge_interval is None
                      else gauge_interval or None, reset_cache=reset_prefix_cache)
    if engine is not None:
        from qtune.engines import get_engine

        eng = get_engine(engine)
        cfg = dataclasses.replace(cfg, metric_names=eng.metric_names(),
                                  reset_paths=eng.cache_reset_paths(),
                                  request_fields=eng.request_fields())
    with console.Status() as status:
        if find_capacity:
            from qtune.capacity import run_capacity

            res = run_capacity(cfg, progress=status.update)
        else:
            res = run_bench(cfg, progress=status.update)
    if csv is not None:
        from qtune.files import write_atomic

        write_atomic(csv, _bench_csv(res), force=force, what="--csv")
    if json_file is not None:
        from qtune import jsonout
        from qtune.files import write_atomic

        write_atomic(json_file, jsonout.dumps(res) + "\n", force=force, what="-o")
    if json_out:
        _print_json(res)
    else:
        console.render_bench(res)
    if _nothing_served(res):
        # Measured, but nothing to report: as search without a best trial.
        raise typer.Exit(3)


def _nothing_served(res: dict[str, Any]) -> bool:
    """A run (or any repeat) in which every request failed."""
    runs = [r for rs in res.get("runs", []) for r in rs] or [res]
    return any(r.get("completed") == 0 and r.get("failed", 0) > 0 for r in runs)


@app.command()
def verify(
    profile: Annotated[Path, typer.Argument(help="Profile YAML from qtune search.")],
    against: Annotated[str, typer.Option(
        help="'defaults' (the engine's own) or another profile's path.")] = "defaults",
    repeat: Annotated[int, typer.Option(min=1, help="Starts of each side.")] = 3,
    startup_timeout: Annotated[float, typer.Option(
        help="Seconds a server may take to become ready.")] = 600.0,
    json_out: JsonOut = False,
) -> None:
    """A/B a profile against the defaults with fresh starts, interleaved."""
    from qtune import console
    from qtune.profile import Profile
    from qtune.search.config import check_positive
    from qtune.verify import verify as do_verify

    check_positive(startup_timeout, "--startup-timeout",
                   "seconds a server may take to become ready, e.g. 600")
    prof = Profile.load(profile)
    other = None if against == "defaults" else Profile.load(Path(against))
    with console.Status() as status:
        res = do_verify(prof, other, repeat, progress=status.update,
                        startup_timeout=startup_timeout, on_run=status.log)
    if json_out:
        _print_json(res)
    else:
        console.render_verify(res)


@app.command()
def check(
    profile: Annotated[Path, typer.Argument(help="Profile YAML from qtune search.")],
    url: Annotated[str, typer.Option(help="Base URL of the running server.")],
    requests: Annotated[int | None, typer.Option(
        min=1, help="Requests per run (default: the profile's workload).")] = None,
    repeat: Annotated[int, typer.Option(min=1, max=100, help="Runs; the median is "
                                        "compared.")] = 1,
    json_out: JsonOut = False,
) -> None:
    """Is a running server still as tuned? Config, then speed. Launches nothing.

    Exit 0 as tuned, 4 slower than tuned (outside the noise), 5 not the tuned
    config, 6 the server does not answer, 1 bad input."""
    from urllib.parse import urlsplit

    from qtune import console
    from qtune.check import check as do_check
    from qtune.profile import Profile

    prof = Profile.load(profile)
    with console.Status() as status:
        res = do_check(prof, url, requests=requests, repeat=repeat, progress=status.update)
    # A server on this host: its hardware is this host's (the engine version
    # came from the server itself).
    local = (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")
    res["warnings"] = _provenance(prof, engine=False) if local else []
    for w in res["warnings"]:
        console.warn(f"this host differs from the one the profile was tuned on: {w}")
    if json_out:
        _print_json(res)
    else:
        console.render_check(res)
    if res["exit_code"]:
        raise typer.Exit(res["exit_code"])


@app.command()
def report(
    study: Annotated[str, typer.Argument(
        help="Study name (studies/<name>.log), or a journal file's path.")],
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    csv: Annotated[Path | None, typer.Option(help="Write the trials table as CSV.")] = None,
    parquet: Annotated[Path | None, typer.Option(
        help="Write the trials table as Parquet (needs pyarrow).")] = None,
    html: Annotated[Path | None, typer.Option(
        help="Write a self-contained HTML report.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the report here, as its suffix says: .html (the "
        "page), .csv or .parquet (the trials table).")] = None,
    force: Force = False,
    json_out: JsonOut = False,
) -> None:
    """Summarise a study: the recommendation, trials table, exports, HTML page."""
    from qtune import console
    from qtune.report import report as do_report

    if out is not None:  # -o/--out: the one spelling; the format from the suffix
        csv, parquet, html = _by_suffix(out, csv=csv, parquet=parquet, html=html)
    res = do_report(study, storage, csv=csv, parquet=parquet, html_path=html,
                    force=force)
    if json_out:
        _print_json(res)
    else:
        console.render_recommendation(res["recommendation"])
        console.render_report(res)
        for label, path in (("csv", csv), ("parquet", parquet), ("html", html)):
            if path:
                console.err.print(f"wrote {label}: {path}")


def _by_suffix(out: Path, **given: Path | None) -> tuple[Path | None, ...]:
    """``report -o FILE``: FILE as the export its suffix names (csv,
    parquet, html), the others as given."""
    from qtune.errors import InputError

    kind = {".htm": "html", ".html": "html", ".csv": "csv",
            ".parquet": "parquet"}.get(out.suffix.lower())
    if kind is None:
        raise InputError(f"-o {out}: cannot tell the format from {out.suffix or 'no suffix'}",
                         hint="end it in .html, .csv or .parquet")
    if given[kind] is not None:
        raise InputError(f"-o {out} and --{kind} {given[kind]} both name the {kind} file",
                         hint=f"give one of -o and --{kind}")
    given[kind] = out
    return given["csv"], given["parquet"], given["html"]


@app.command()
def dashboard(
    study: Annotated[str, typer.Argument(help="Study name.")],
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8080,
) -> None:
    """Open optuna-dashboard on a study (if installed), on loopback only."""
    from qtune.errors import InputError
    from qtune.report import load_study

    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise InputError("optuna-dashboard is not installed",
                         hint="pip install optuna-dashboard") from None
    st, url = load_study(study, storage)
    # The dashboard can delete studies: never bind beyond loopback.
    from qtune.search.optuna_api import storage_of

    run_server(storage_of(st), host="127.0.0.1", port=port)


@app.command("storage-proxy")
def storage_proxy(
    storage: Annotated[str, typer.Option(
        envvar="QTUNE_STORAGE", show_envvar=True,
        help="The fleet's database, postgresql://user:PASS@host/db (from the "
        "environment, the password stays out of the process list).")],
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 13000,
    host: Annotated[str, typer.Option(
        help="Address to listen on. The proxy has no login: 0.0.0.0 (workers on "
        "other hosts) only on a trusted network.")] = "127.0.0.1",
) -> None:
    """Serve a fleet's database to its workers through Optuna's gRPC storage
    proxy: the workers then take --storage grpc://HOST:PORT."""
    from qtune import console
    from qtune.search.proxy import serve

    serve(storage, host, port, lambda line: console.err.print(line, markup=False))


def _bench_csv(res: dict[str, Any]) -> str:
    import pandas as pd

    from qtune.bench import KEY_METRICS
    from qtune.metrics import metric_value

    if "capacity" in res:
        rows = res["capacity"]["steps"]
    elif "runs" in res:
        rows = [{"url": res["urls"][k], "run": i,
                 **{m: metric_value(r, m) for m in KEY_METRICS}}
                for k, runs in enumerate(res["runs"]) for i, r in enumerate(runs)]
    else:
        rows = [{m: metric_value(res, m) for m in KEY_METRICS}]
    from qtune.files import csv_text

    return csv_text(pd.DataFrame(rows))


def _provenance(profile: Any, engine: bool = True) -> list[str]:
    """How this host differs from the profile's (hardware, and the engine
    when it is installed for this Python)."""
    from qtune.engines import find_engines
    from qtune.host import probe
    from qtune.host.provenance import engine_difference, host_differences

    out = host_differences(profile.host, probe().fingerprint())
    found = find_engines(sys.executable).get(profile.engine.name) if engine else None
    if found is not None:
        d = engine_difference(profile.engine.version, found.version, profile.engine.name)
        if d:
            out.append(d)
    return out


@app.command(cls=FilledCommand)
def emit(
    profile: Annotated[Path, typer.Argument(help="Profile YAML from qtune search.")],
    format: Annotated[str, typer.Option(
        "--format", "-f", help="{emitters}")] = "systemd",
    output: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write here (atomically).")
    ] = None,
    output_old: Annotated[  # the spelling before -o/--out on every command
        Path | None, typer.Option("--output", hidden=True)] = None,
    image: Annotated[str | None, typer.Option(
        help="Container image for compose/kubernetes (default: the engine's "
             "published image at the tuned version).")] = None,
    autoscale: Annotated[str | None, typer.Option(
        help="kubernetes: add an autoscaler (hpa, or a KEDA ScaledObject: keda) on "
             "completed requests per pod at 80% of the profile's measured rate.")] = None,
    max_replicas: Annotated[int, typer.Option(
        min=1, max=1000, help="kubernetes --autoscale: most replicas.")] = 4,
    prometheus_url: Annotated[str | None, typer.Option(
        help="kubernetes --autoscale keda: the Prometheus KEDA asks (default: "
             "the Prometheus Operator's prometheus-operated Service).")] = None,
    user: Annotated[str | None, typer.Option(
        help="systemd: run as this user (default: a DynamicUser=).")] = None,
    allow_tmp: Annotated[bool, typer.Option(
        help="systemd: drop PrivateTmp= so paths under /tmp stay visible.")] = False,
    force: Force = False,
    json_out: JsonOut = False,
) -> None:
    """Turn a profile into a deployable unit (printed, or written with -o)."""
    from qtune import console
    from qtune.emit import CONTAINER_EMITTERS
    from qtune.emit import emit as do_emit
    from qtune.files import check_target, write_atomic
    from qtune.profile import Profile

    output = output or output_old
    if output is not None:  # before the profile is read
        check_target(output, "-o", force=force, inputs=(profile,))
    if prometheus_url is not None and redact(prometheus_url) != prometheus_url:
        # Secrets by shape (user-info, ?token=...): a manifest is no place for one.
        from qtune.errors import InputError

        raise InputError(f"--prometheus-url {prometheus_url}: holds a secret",
                         hint="give KEDA its credentials in a TriggerAuthentication "
                         "(a Kubernetes Secret), not in the URL")
    prof = Profile.load(profile)
    text = do_emit(prof, format, image, autoscale, max_replicas, prometheus_url, user,
                   allow_tmp)
    # A container does not run on this host: its differences say nothing.
    warnings = [] if format in CONTAINER_EMITTERS else _provenance(prof)
    for w in warnings:
        console.warn(f"this host differs from the one the profile was tuned on: {w}")
    if output is not None:
        write_atomic(output, text, force=force, what="-o", inputs=(profile,))
        if not json_out:
            console.err.print(f"wrote {output}")
    if json_out:
        _print_json({"format": format, "output": str(output) if output else None,
                     "text": text, "warnings": warnings})
    elif output is None:
        sys.stdout.write(text)


def main() -> None:
    import logging

    # Optuna logs every trial at INFO; qtune's own progress says more.
    logging.getLogger("optuna").setLevel(logging.WARNING)
    from qtune.server import install_signal_handlers

    install_signal_handlers()
    _state.update(json=False, json_printed=False)  # one command per call
    try:
        from qtune.deps import check as check_libraries

        check_libraries()  # before any file is read or server launched
        # Without standalone mode Typer *returns* exit codes (typer.Exit,
        # and 130 for Ctrl-C) instead of raising them.
        rc = app(standalone_mode=False)
        if rc == 130:
            raise KeyboardInterrupt
        sys.exit(rc if isinstance(rc, int) else 0)
    except QtuneError as exc:
        if _state["debug"]:
            raise
        from qtune import console

        console.render_error(exc)
        if _json_wanted():
            _json_error(exc.message, exc.hint, exc.exit_code, _kind(exc))
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _interrupted_json()
        sys.exit(130)
    except KeyboardInterrupt:
        from qtune import console

        console.err.print("interrupted: servers stopped, study saved")
        _interrupted_json()
        sys.exit(130)
    except Exception as exc:  # click usage errors and the unexpected
        # Usage errors (typer vendors its own click: match by shape).
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            if _json_wanted():
                ctx = getattr(exc, "ctx", None)
                where = ctx.command_path if ctx is not None else "qtune"
                _json_error(redact(getattr(exc, "format_message", str)()),
                            f"{where} --help", exc.exit_code, "usage")
            sys.exit(exc.exit_code)
        if _state["debug"]:
            raise
        from qtune import console

        try:  # the error's own text is data: it may not even convert
            detail = redact(str(exc))[:300]
        except Exception:
            detail = "(its message cannot be shown)"
        # (console: no markup, control characters shown escaped, one line)
        console.err.print(f"internal error: {redact(type(exc).__name__)}: {detail}")
        console.err.print("hint: re-run with --debug for the traceback, and report it")
        if _json_wanted():
            _json_error(f"internal error: {redact(type(exc).__name__)}: "
                        f"{redact(str(exc))[:300]}",
                        "re-run with --debug for the traceback, and report it", 1,
                        "internal")
        sys.exit(1)


def _json_wanted() -> bool:
    # A usage error can come before the --json option is read: then its
    # presence on the command line decides.
    return _state["json"] or "--json" in sys.argv[1:]


def _kind(exc: QtuneError) -> str:
    """``InputError`` -> ``input``: the error's kind as errors.md lists it."""
    return type(exc).__name__.removesuffix("Error").lower() or "qtune"


def _interrupted_json() -> None:
    if _json_wanted():
        _json_error("interrupted", None, 130, "interrupted")
