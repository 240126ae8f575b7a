"""The search's option groups: each owns its fields, its command-line
options (a field's ``option`` metadata, which ``qtune.cli`` turns into a
flag in the group's help panel) and its validation (``check``), so that a
new option is one field here.

``TuneConfig`` (``qtune.search.config``) holds one of each beside the
workload and the search's own options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from qtune.errors import InputError

# Here, not in qtune.capacity and qtune.quality, which use them: the
# command line reads this module at every start, and those import the load
# client and the engines.
# --capacity-tolerance: the bracket is narrowed until (failed - held) / held
# is at most this.
DEFAULT_TOLERANCE = 0.1
# --max-quality-loss:
# Measured on the 2-core CPU target with SmolLM2-135M (README, "Answer
# quality"): a restart of the defaults and max_num_seqs 8 gave the defaults'
# log-probabilities bit for bit (loss 0.0, 16/16 greedy outputs); an fp8 KV
# cache (e4m3) +1.51%, 0.15 nats per token, 1/16 greedy outputs the same.
# 1% lets every lossless config through and refuses that one; a model whose
# fp8 KV cache costs it less passes.
DEFAULT_MAX_LOSS = 0.01


def option(default: Any, help: str, *, flag: str, min: float | None = None,
           max: float | None = None, cli_default: Any = ...) -> Any:
    """A field that is also a command-line option: ``flag`` (``--x``; a bool
    is an on-switch), its help, its bounds, and the default the command
    line shows when it differs from the field's (None: "was it given?")."""
    return field(default=default, metadata={
        "flag": flag, "help": help, "min": min, "max": max,
        "cli_default": default if cli_default is ... else cli_default})


class OptionGroup:
    """What every group has: a help panel, and a constructor from the
    command line's values (None: not given, the field's default)."""

    panel: ClassVar[str]

    @classmethod
    def from_cli(cls, given: dict[str, Any]) -> Any:
        return cls(**{k: v for k, v in given.items() if v is not None})

    def check(self) -> None:
        """The values on their own, before any file is read or process started."""


@dataclass(frozen=True)
class Confirmation(OptionGroup):
    """After the search: the best configs and the engine defaults measured
    again on fresh starts, interleaved."""

    panel: ClassVar[str] = "Confirmation"
    top: int = option(3, flag="--confirm-top", min=0, cli_default=None, help=(
        "After the search, re-measure this many best configs and the engine defaults on "
        "fresh starts, 0: off (default: 3, or with --time-budget as many as fit in 30% "
        "of it)."))
    repeats: int = option(2, flag="--confirm-repeats", min=1, cli_default=None, help=(
        "Fresh starts per confirmed config, interleaved (default: 2, or with "
        "--time-budget as many as fit)."))
    # The two above were given (not defaults): with --time-budget they are
    # kept and the search stops earlier; else qtune sizes them to the budget.
    fixed: bool = False

    @classmethod
    def from_cli(cls, given: dict[str, Any]) -> Confirmation:
        fixed = given.get("top") is not None or given.get("repeats") is not None
        return cls(**{k: v for k, v in given.items() if v is not None}, fixed=fixed)


@dataclass(frozen=True)
class CapacitySearch(OptionGroup):
    """``--objective capacity``: how finely a capacity is bracketed, and how
    long each probe holds its load."""

    panel: ClassVar[str] = "Search"
    # The bracket is narrowed until (failed - held) / held is at most this
    # (qtune.capacity).
    tolerance: float = option(DEFAULT_TOLERANCE, flag="--capacity-tolerance", help=(
        "--objective capacity: narrow each capacity's bracket [held, failed) to this "
        "fraction of it."))
    # Each probe also runs at least 10 service times
    # (qtune.capacity.WINDOW_SERVICE_TIMES).
    window: float = option(20.0, flag="--capacity-window", help=(
        "--objective capacity: shortest arrival window of a probe, in seconds (each "
        "also runs at least 10 service times)."))

    def check(self) -> None:
        if not (math.isfinite(self.tolerance) and 0.01 <= self.tolerance <= 1):
            raise InputError(f"--capacity-tolerance {self.tolerance}: not between 0.01 "
                             "and 1", hint="a fraction of the capacity, e.g. 0.1 for 10%")
        if not (math.isfinite(self.window) and 1 <= self.window <= 3600):
            raise InputError(f"--capacity-window {self.window}: not between 1 and 3600",
                             hint="seconds of arrivals a capacity probe holds, e.g. 20")


@dataclass(frozen=True)
class QualityGate(OptionGroup):
    """Lossy options (fp8 KV cache, fp8 weights) and the gate that measures
    what they cost in answers (``qtune.quality``)."""

    panel: ClassVar[str] = "Quality"
    exact: bool = option(False, flag="--exact", help=(
        "Keep the model's numerics: leave fp8 KV cache and fp8 weights out of the "
        "space."))
    # Search lossy options where their quality cannot be measured (random
    # weights); without it they are searched only where it can (issue 27).
    lossy: bool = option(False, flag="--lossy", help=(
        "Search fp8 KV cache and fp8 weights even where their answer quality cannot be "
        "measured (random weights); the profile and every emitted file then say so. "
        "Without it they are searched only where the quality gate runs."))
    # A real-weights trial whose perplexity on the shipped text rises more
    # than this over the engine defaults' is infeasible.
    max_loss: float = option(DEFAULT_MAX_LOSS, flag="--max-quality-loss", min=0.0, help=(
        "With real weights: a config whose perplexity on qtune's evaluation text rises "
        "more than this fraction over the engine defaults' is infeasible (0.01: +1%)."))

    def check(self) -> None:
        if not (math.isfinite(self.max_loss) and self.max_loss >= 0):
            raise InputError(f"--max-quality-loss {self.max_loss}: must be a finite "
                             "number, 0 or more",
                             hint="a fraction of the perplexity, e.g. 0.01 for +1%")
        if self.exact and self.lossy:
            raise InputError("--exact and --lossy: choose one",
                             hint="--exact keeps the model's numerics; --lossy searches "
                             "fp8 even where its quality cannot be measured")


@dataclass(frozen=True)
class Fleet(OptionGroup):
    """Several workers on one database server storage (``search/fleet.py``)."""

    panel: ClassVar[str] = "Fleet"
    gpus: str | None = option(None, flag="--gpus", help=(
        "This worker's GPUs: indices (0,1; one index: 1,) or a count of GPUs no other "
        "qtune on this host holds. Its servers see only these."))
    finish: bool = option(False, flag="--finish", help=(
        "With --study: only confirm the top configs and write the profile of a study "
        "that workers ran (the last worker does it itself)."))
    allow_mixed_hosts: bool = option(False, flag="--allow-mixed-hosts", help=(
        "Let this worker join a study measured on other GPUs or another engine "
        "version."))
    heartbeat_s: int = option(60, flag="--heartbeat", min=1, help=(
        "On a database server storage (a fleet of workers): seconds between a running "
        "trial's heartbeats; a trial 5 beats late is failed and re-queued."))


GROUPS: dict[str, type[OptionGroup]] = {
    "confirm": Confirmation, "capacity": CapacitySearch, "quality": QualityGate,
    "fleet": Fleet,
}


def cli_fields(group: type[OptionGroup]) -> list[Any]:
    """The group's fields that are command-line options."""
    return [f for f in fields(group) if "flag" in f.metadata]  # type: ignore[arg-type]


def cli_name(f: Any) -> str:
    """A group field's name on the command line, as a Python name
    (``--confirm-top``: ``confirm_top``)."""
    return str(f.metadata["flag"]).lstrip("-").replace("-", "_")


def grouped(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` with each group's options, named as on the command line
    (``confirm_top=0``), gathered into its group: TuneConfig's keyword
    arguments for a script that speaks in flags.  Other keys stay.  As on
    the command line, a confirmation size given is a fixed one; and a group
    built here replaces the whole group (in ``dataclasses.replace`` too:
    its other fields take their defaults)."""
    out = dict(flat)
    for key, group in GROUPS.items():
        given = {f.name: out.pop(cli_name(f)) for f in cli_fields(group)
                 if cli_name(f) in out}
        if given:
            out[key] = group.from_cli(given)
    return out
