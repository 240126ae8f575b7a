"""The command line's options and help: the option types the commands
share, the workload options (``with_load_options``) and the option groups
(``with_option_groups``) each declared once, and ``--help`` in panels with
one style of default.  ``qtune.cli`` holds the commands."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from qtune.options import (
    CapacitySearch,
    Confirmation,
    Fleet,
    OptionGroup,
    QualityGate,
    cli_fields,
    cli_name,
)

if TYPE_CHECKING:
    from qtune.load.workload import Workload


class HelpCommand(TyperCommand):
    """Every command's --help: options in panels (``_PANELS``), flags
    without a ``<bool>`` metavar (it suggested ``--json true``, which fails),
    and every default written one way, "(default: X)" in the help text
    (rich reads "[default X]" as a style tag)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_help(self, ctx)
        super().format_help(ctx, formatter)


class HelpGroup(TyperGroup):
    """qtune's own --help: its flags without a ``<bool>`` metavar too (three
    options: no panels)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_help(self, ctx, panels=False)
        super().format_help(ctx, formatter)


def tidy_help(command: Any, ctx: Any, panels: bool = True) -> None:
    """Panels, types and defaults of a command's options (``HelpCommand``)."""
    own = _COMMAND_PANELS.get(command.name or "", {}) if panels else {}
    for param in command.get_params(ctx):
        if not isinstance(param, TyperOption):
            continue
        panel = own.get(param.name or "") or (_PANELS.get(param.name or "") if panels
                                              else None)
        if panel and not getattr(param, "rich_help_panel", None):
            param.rich_help_panel = panel
        # One short type column (no "<float range> [0.0<=x<=1.0]" that
        # squeezed the option names to "--max-quality-lo…" at 80
        # columns); a flag takes no value, so none.
        compact = None if param.is_flag else (
            param.display_type(ctx) or "").replace(" range", "")
        param.display_type_rich = functools.partial(  # type: ignore[method-assign]
            _shown_type, compact)
        param._get_number_range_help_str = str  # type: ignore[method-assign]
        default = param.default
        if param.show_default and param.name != "help" and "(default" not in (
                param.help or ""):
            shown = _shown_default(param, default)
            if shown:
                text = (param.help or "").rstrip()
                param.help = (f"{text[:-1]} (default: {shown})." if text.endswith(".")
                              else f"{text} (default: {shown})").strip()
        param.show_default = False
    # Panels in one order on every command (Typer shows them in the
    # order their first option comes): what is worked on, how, the output.
    order = ["Study", "Server", "Engine", "Workload", "Search", "Measurement",
             "Confirmation", "Quality", "Fleet", "Deployment", "Output"]
    command.params.sort(
        key=lambda p: order.index(str(getattr(p, "rich_help_panel", "")))
        if getattr(p, "rich_help_panel", None) in order else -1)


def _shown_type(shown: str | None, ctx: Any) -> str | None:
    return shown


def _shown_default(param: TyperOption, default: Any) -> str | None:
    if default is None or callable(default):
        return None
    if param.is_flag:
        # a flag pair (--memory-check/--no-memory-check) says which is on
        return param.opts[0] if default is True and param.secondary_opts else None
    if isinstance(default, (list, tuple)):
        return None if not default else ", ".join(map(str, default))
    return f"{default:g}" if isinstance(default, float) else str(default)


# Help panels, by parameter name (``_COMMAND_PANELS``: a command's own
# meaning of a shared name).  The option groups of qtune.search.options
# (confirmation, capacity, quality, fleet) carry their own panel.
_PANEL_NAMES: dict[str, tuple[str, ...]] = {
    "Engine": ("model", "engine", "engine_python", "max_model_len", "startup_timeout"),
    "Workload": ("rate", "concurrency", "input_len", "output_len", "requests", "duration",
                 "warmup", "seed", "arrival", "burstiness", "dataset", "prefix_count",
                 "prefix_len", "endpoint", "request_timeout", "stall_timeout",
                 "workload"),
    "Search": ("trials", "objective", "slo", "space", "sampler", "sampler_seed",
               "time_budget", "no_memory_check", "prune_margin", "levels"),
    "Confirmation": ("speculative", "pick"),
    "Fleet": ("study", "storage"),
    "Output": ("out", "output", "force", "json_out", "csv", "html", "parquet", "capture",
               "help"),
}
_PANELS = {name: panel for panel, names in _PANEL_NAMES.items() for name in names}
_SERVER = {"url": "Server", "model": "Server", "tokenizer": "Server",
           "no_metrics": "Server", "reset_prefix_cache": "Server",
           "gauge_interval": "Server"}
_COMMAND_PANELS: dict[str, dict[str, str]] = {
    "bench": {**_SERVER, **{k: "Measurement" for k in (
        "slo", "repeat", "find_capacity", "capacity_window", "capacity_tolerance")}},
    "check": {"url": "Server", "requests": "Measurement", "repeat": "Measurement"},
    "report": {"study": "Study", "storage": "Study"},
    "dashboard": {"study": "Study", "storage": "Study"},
    "emit": {"image": "Deployment", "autoscale": "Deployment",
             "max_replicas": "Deployment", "prometheus_url": "Deployment",
             "format": "Deployment"},
}



EnginePython = Annotated[
    str | None,
    typer.Option(
        "--engine-python",
        help="Python of the environment where the engine is installed "
        "(default: this one), or one per engine: vllm=PATH,sglang=PATH.",
    ),
]
Force = Annotated[bool, typer.Option(
    "--force", help="Replace an output file even if it is read-only (it stays "
    "read-only). Devices, FIFOs, folders and links are never replaced.")]



Rate = Annotated[float | None, typer.Option(
    help="Requests per second (Poisson arrivals unless --arrival constant).")]
Concurrency = Annotated[int | None, typer.Option(
    help="Fixed number of in-flight requests (default: {concurrency} without --rate).")]
InputLen = Annotated[str | None, typer.Option(
    help="Prompt tokens: 256, 128-512 (uniform) or normal:256:64 (default: {input_len}).")]
OutputLen = Annotated[str | None, typer.Option(
    help="Output tokens, same forms as --input-len (default: {output_len}).")]
Requests = Annotated[int | None, typer.Option(
    help="Measured requests per run (default: {requests} unless --duration; with "
    "--duration, no count bound unless given).")]
Duration = Annotated[float | None, typer.Option(
    help="Measured seconds per run (runs the whole time unless --requests ends "
    "it first).")]
RequestTimeout = Annotated[float | None, typer.Option(
    help="Seconds one request may take in all; past it, a failed request "
    "('timeout') (default: {request_timeout}).")]
StallTimeout = Annotated[float | None, typer.Option(
    help="Seconds a started stream may send nothing; past it, a failed request "
    "('stalled') (default: {stall_timeout}).")]
Warmup = Annotated[int | None, typer.Option(
    help="Warm-up requests, not counted (default: {warmup_requests}).")]
Seed = Annotated[int | None, typer.Option(help="Seed for prompts and arrivals.")]
Arrival = Annotated[str | None, typer.Option(help="{arrivals} (with --rate).")]
Burstiness = Annotated[float | None, typer.Option(
    help="Gamma shape of inter-arrivals: 1 Poisson, <1 burstier.")]
Dataset = Annotated[str | None, typer.Option(
    help="ShareGPT JSON or JSONL with 'prompt' (and 'output_tokens'), or "
    "builtin:python-docs (64 prompts of real English shipped with qtune).")]
PrefixCount = Annotated[int | None, typer.Option(
    help="Shared-prefix workload: number of distinct system prompts.")]
PrefixLen = Annotated[int | None, typer.Option(help="Tokens per shared prefix.")]
Endpoint = Annotated[str | None, typer.Option(help="{endpoints}.")]
WorkloadFile = Annotated[Path | None, typer.Option(
    "--workload", help="YAML file with the same keys (flags override it).")]
SloOpt = Annotated[str | None, typer.Option(
    help="Constraints, comma-separated: 'ttft_p99<=500ms,e2e_p99<=3s'.")]

# The options search and bench share, in their --help order: option (parameter)
# name, its type, and the Workload field it sets (None: the --workload file).
# None as every default: "not given", so that a --workload file's value stands
# unless a flag overrides it; the defaults are Workload's own.
WORKLOAD_OPTIONS: tuple[tuple[str, Any, str | None], ...] = (
    ("rate", Rate, "rate"),
    ("concurrency", Concurrency, "concurrency"),
    ("input_len", InputLen, "input_len"),
    ("output_len", OutputLen, "output_len"),
    ("requests", Requests, "requests"),
    ("duration", Duration, "duration"),
    ("warmup", Warmup, "warmup_requests"),
    ("seed", Seed, "seed"),
    ("arrival", Arrival, "arrival"),
    ("burstiness", Burstiness, "burstiness"),
    ("dataset", Dataset, "dataset"),
    ("prefix_count", PrefixCount, "prefix_count"),
    ("prefix_len", PrefixLen, "prefix_len"),
    ("endpoint", Endpoint, "endpoint"),
    ("request_timeout", RequestTimeout, "request_timeout"),
    ("stall_timeout", StallTimeout, "stall_timeout"),
    ("workload", WorkloadFile, None),
)


@dataclass(frozen=True)
class LoadOptions:
    """The workload options as given on the command line (None: not given)."""

    given: dict[str, Any] = dataclasses.field(default_factory=dict)

    def workload(self) -> Workload:
        """One Workload: the --workload file, then the flags given over it,
        then Workload's own defaults."""
        from qtune.load.workload import Workload, load_workload_file

        file = self.given.get("workload")
        data = load_workload_file(file) if file is not None else {}
        if "warmup_requests" in data and data["warmup_requests"] is None:
            del data["warmup_requests"]  # a file's "warmup_requests: null": the default
        data.update({field: self.given[opt] for opt, _, field in WORKLOAD_OPTIONS
                     if field is not None and self.given.get(opt) is not None})
        return Workload(**data)


NOT_GIVEN = LoadOptions()
# The option groups' defaults (with_option_groups puts their options in place)
CONFIRM, CAPACITY, QUALITY, FLEET = Confirmation(), CapacitySearch(), QualityGate(), Fleet()


_C = TypeVar("_C", bound=Callable[..., Any])


def with_load_options(command: _C) -> _C:
    """Declare the workload options once: the command takes one parameter
    ``load: LoadOptions``, and its --help lists the options in its place."""
    sig = inspect.signature(command, eval_str=True)
    params = list(sig.parameters.values())
    at = [p.name for p in params].index("load")
    shared = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=None, annotation=kind)
              for name, kind, _ in WORKLOAD_OPTIONS]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name, _, _ in WORKLOAD_OPTIONS}
        return command(load=LoadOptions(given), **kwargs)

    # Typer reads the signature and the type hints of the function it is
    # given; without __wrapped__, both are run's own.
    del run.__wrapped__
    new = sig.replace(parameters=[*params[:at], *shared, *params[at + 1:]])
    run.__signature__ = new  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in new.parameters.values()}
    return cast(_C, run)


def with_option_groups(command: _C) -> _C:
    """Each parameter of ``command`` typed as an option group (``qtune.search.
    options``) becomes the group's options, in its help panel; the command
    gets the group built from them (``from_cli``: None, not given, keeps the
    field's default).  A new option is a field of its group, nothing here."""
    import typing


    sig = inspect.signature(command, eval_str=True)
    groups: dict[str, type[OptionGroup]] = {}
    names: dict[str, list[tuple[str, str]]] = {}
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        kind = p.annotation
        if not (isinstance(kind, type) and issubclass(kind, OptionGroup)):
            params.append(p)
            continue
        groups[p.name] = kind
        hints = typing.get_type_hints(kind)
        for f in cli_fields(kind):
            md, name = f.metadata, cli_name(f)
            names.setdefault(p.name, []).append((name, f.name))
            typ = hints[f.name]
            if md["cli_default"] is None:
                typ = typ | None
            opt = typer.Option(md["flag"], help=md["help"], min=md["min"], max=md["max"],
                               rich_help_panel=kind.panel)
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                            default=md["cli_default"],
                                            annotation=Annotated[typ, opt]))

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        for group, pairs in names.items():
            kwargs[group] = groups[group].from_cli(
                {field: kwargs.pop(cli) for cli, field in pairs})
        return command(**kwargs)

    del run.__wrapped__  # Typer reads run's own signature, set here
    ordered = sorted(params, key=lambda p: p.kind)  # keyword-only after the rest
    new = sig.replace(parameters=ordered)
    run.__signature__ = new  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in new.parameters.values()}
    return cast(_C, run)


def help_fill() -> dict[str, str]:
    """What the {placeholders} of help texts stand for: the registries' names
    and Workload's defaults."""
    from qtune.emit import CONTAINER_EMITTERS, EMITTERS
    from qtune.engines import ENGINES
    from qtune.load import workload as w
    from qtune.objectives import OBJECTIVES, PARETO_DEFAULT_LATENCY
    from qtune.search.space import SAMPLERS

    defaults = {f.name: f.default for f in dataclasses.fields(w.Workload)}
    return {
        "engines": " | ".join(ENGINES),
        "emitters": " | ".join([*EMITTERS, *CONTAINER_EMITTERS]),
        "samplers": " | ".join(SAMPLERS),
        "objectives": " | ".join(OBJECTIVES) + " | pareto[:LATENCY] (throughput "
        f"against {PARETO_DEFAULT_LATENCY} or LATENCY)",
        "arrivals": " | ".join(w.ARRIVALS),
        "endpoints": " | ".join(w.ENDPOINTS),
        "concurrency": str(w.DEFAULT_CONCURRENCY),
        "requests": str(w.DEFAULT_REQUESTS),
        **{k: f"{defaults[k]:g}" if isinstance(defaults[k], float) else str(defaults[k])
           for k in ("input_len", "output_len", "warmup_requests", "request_timeout",
                     "stall_timeout")},
    }


class FilledCommand(HelpCommand):
    """A command whose options' help is completed (see ``help_fill``) only
    when it is shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        fill = help_fill()
        for param in self.params:
            text = getattr(param, "help", None)
            if text and "{" in text:
                for key, value in fill.items():
                    text = text.replace("{" + key + "}", value)
                param.help = text  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)
