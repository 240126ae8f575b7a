"""Command line: parse, build one config, call one entrypoint, render.

Errors are caught once, in ``main``: a ``QtuneError`` prints one line and a
hint and exits 1 (2 for usage errors from Typer); ``--debug`` shows the
traceback instead.  Human output goes to stderr, ``--json`` to stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from qtune import __version__
from qtune.errors import QtuneError, redact

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # locals may hold tokens; we render errors
    help="Tune an LLM inference server on this host, and deploy the winner.",
)
_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        print(f"qtune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True)
    ] = False,
) -> None:
    _state["debug"] = debug


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


EnginePython = Annotated[
    str | None,
    typer.Option(
        "--engine-python",
        help="Python of the environment where the engine is installed "
        "(default: this one).",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


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
    from qtune.host import capture as do_capture
    from qtune.host import probe as do_probe

    facts = do_probe(engine_python=engine_python)
    d = facts.to_dict()
    if capture is not None:
        n = do_capture(capture)
        console.err.print(f"captured {n} files into {capture}")
    if json_out:
        _print_json(d)
    else:
        console.render_probe(d)


@app.command()
def search(
    model: Annotated[
        str | None,
        typer.Option(help="Model folder (config.json; weights optional) or a "
                     "Hugging Face id already in the local cache. Default: "
                     "qtune's embedded tiny model."),
    ] = None,
    engine: Annotated[str, typer.Option(help="Engine adapter.")] = "vllm",
    engine_python: EnginePython = None,
    trials: Annotated[int, typer.Option(min=1, help="Server launches, "
                                        "including the defaults baseline.")] = 10,
    rate: Annotated[float | None, typer.Option(help="Poisson arrivals, req/s.")] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Fixed number of in-flight requests.")
    ] = None,
    input_len: Annotated[int, typer.Option(help="Prompt tokens.")] = 256,
    output_len: Annotated[int, typer.Option(help="Output tokens.")] = 64,
    requests: Annotated[
        int | None, typer.Option(help="Measured requests per trial.")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Measured seconds per trial.")
    ] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up requests (not counted).")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for prompts, arrivals, sampler.")] = 0,
    objective: Annotated[
        str, typer.Option(help="e2e_p99 | ttft_p99 | tpot_p99 | throughput | ...")
    ] = "e2e_p99",
    slo: Annotated[
        str | None,
        typer.Option(help="Constraints, e.g. 'ttft_p99<=500ms,tpot_p99<=50ms'."),
    ] = None,
    space: Annotated[
        Path | None, typer.Option(help="YAML file narrowing or fixing parameters.")
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (resumes if it exists).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="Optuna storage URL (default: a journal file under "
                     "studies/)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Profile path (default profiles/<study>.yaml).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="Pass --max-model-len to the engine.")
    ] = None,
    startup_timeout: Annotated[
        float, typer.Option(help="Seconds a server may take to become ready.")
    ] = 600.0,
    json_out: JsonOut = False,
) -> None:
    """Tune the engine's launch flags against a live load; write a profile."""
    from qtune import console
    from qtune.load.workload import Workload
    from qtune.search import prepare, run_study
    from qtune.search.config import TuneConfig, parse_slo
    from qtune.server import install_signal_handlers

    if rate is None and concurrency is None:
        concurrency = 4
    if requests is None and duration is None:
        requests = 64
    wl = Workload(input_len=input_len, output_len=output_len, rate=rate,
                  concurrency=concurrency, requests=requests, duration=duration,
                  warmup_requests=warmup, seed=seed)
    cfg = TuneConfig(model=model, engine=engine, engine_python=engine_python,
                     trials=trials, workload=wl, objective=objective,
                     slo=parse_slo(slo), space_file=space, study=study,
                     storage=storage, out=out, max_model_len=max_model_len,
                     startup_timeout=startup_timeout, seed=seed)
    prep = prepare(cfg)
    install_signal_handlers()
    with console.SearchReporter(objective) as rep:
        res = run_study(prep, rep)
    if json_out:
        _print_json({
            "study": res.study_name,
            "storage": res.storage,
            "profile": str(res.profile_path) if res.profile_path else None,
            "improvement": res.improvement,
            "best": res.best.__dict__ if res.best else None,
            "baseline": res.baseline.__dict__ if res.baseline else None,
            "trials": [t.__dict__ for t in res.trials],
        })
    else:
        console.render_search_result(res)
    if res.best is None:
        raise typer.Exit(3)


@app.command()
def emit(
    profile: Annotated[Path, typer.Argument(help="Profile YAML from qtune search.")],
    format: Annotated[str, typer.Option("--format", "-f", help="systemd")] = "systemd",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (atomically).")
    ] = None,
    json_out: JsonOut = False,
) -> None:
    """Turn a profile into a deployable unit (printed, or written with -o)."""
    from qtune import console
    from qtune.emit import emit as do_emit
    from qtune.profile import Profile, write_atomic

    text = do_emit(Profile.load(profile), format)
    if output is not None:
        write_atomic(output, text)
        if not json_out:
            console.err.print(f"wrote {output}")
    if json_out:
        _print_json({"format": format, "output": str(output) if output else None,
                     "text": text})
    elif output is None:
        sys.stdout.write(text)


def main() -> None:
    import logging

    # Optuna logs every trial at INFO; qtune's own progress says more.
    logging.getLogger("optuna").setLevel(logging.WARNING)
    try:
        app(standalone_mode=False)
    except QtuneError as exc:
        if _state["debug"]:
            raise
        from qtune import console

        console.render_error(exc)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except KeyboardInterrupt:
        from qtune import console

        console.err.print("interrupted: servers stopped, study saved")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the unexpected
        # Usage errors (typer vendors its own click: match by shape).
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(exc.exit_code)
        if _state["debug"]:
            raise
        from qtune import console

        console.err.print(f"internal error: {redact(type(exc).__name__)}: "
                          f"{redact(str(exc))[:300]}")
        console.err.print("hint: re-run with --debug for the traceback, and report it")
        sys.exit(1)
