"""The one config object a search runs from, and the parsers of its texts
(``--space FILE``, ``--levels``; ``--slo`` and ``--objective``: qtune.objectives)."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qtune.engines.base import Param
from qtune.errors import InputError, StudyError, printable
from qtune.load.workload import Workload
from qtune.objectives import SLO
from qtune.options import CapacitySearch, Confirmation, Fleet, QualityGate
from qtune.params import JSONObject, Params
from qtune.yamlfile import read_mapping


@dataclass
class SpaceOverride:
    """``--space FILE``: per-parameter narrowing, fixing or re-ranging."""

    entries: dict[str, Any] = field(default_factory=dict)
    source: str = ""


_SPACE_HINT = ("each key is a parameter (an engine argument's dest: its flag in snake_case): "
               "a value fixes it, a list gives choices, {low, high, log} a range; "
               "e.g. 'NAME: {low: 8, high: 128}'")


def load_space_file(path: Path) -> SpaceOverride:
    """Read and check what can be checked without the engine (the shape of
    each entry), so a bad file fails before any probe or launch."""
    data = read_mapping(path, "--space", _SPACE_HINT)
    for name, spec in data.items():
        where = f"--space {printable(str(path))}: {printable(str(name))[:60]}"
        if not isinstance(name, str):
            raise InputError(f"{where}: parameter names are strings", hint=_SPACE_HINT)
        if isinstance(spec, dict):
            _check_range(spec, where)
        elif isinstance(spec, list):
            if not spec:
                raise InputError(f"{where}: empty list of choices",
                                 hint="list at least one value")
            for v in spec:
                _check_scalar(v, where)
        else:
            _check_scalar(spec, where)
    return SpaceOverride(data, str(path))


def _check_scalar(v: Any, where: str) -> None:
    if v is None or isinstance(v, (dict, list)):
        raise InputError(f"{where}: a value must be a number, string or true/false",
                         hint=_SPACE_HINT)
    if isinstance(v, float) and not math.isfinite(v):
        raise InputError(f"{where}: {v} is not a finite number", hint=_SPACE_HINT)


def _check_range(spec: dict[Any, Any], where: str) -> None:
    """A ``{low, high, log, step}`` range: numbers, finite, ordered, a log
    range above 0 (Optuna's log distributions need low > 0) and a positive
    step, never both log and step."""
    extra = sorted(str(k) for k in set(spec) - {"low", "high", "log", "step"})
    if extra:
        raise InputError(f"{where}: a range takes low/high/log/step",
                         hint=f"unknown keys {extra}")
    for key in ("low", "high", "step"):
        v = spec.get(key)
        if v is None and key in spec:
            raise InputError(f"{where}: {key} is empty", hint="give a number")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v)):
            raise InputError(f"{where}: {key} must be a finite number",
                             hint="e.g. {low: 8, high: 128}")
    if "log" in spec and not isinstance(spec["log"], bool):
        raise InputError(f"{where}: log must be true or false", hint="log: true")
    low, high, step = spec.get("low"), spec.get("high"), spec.get("step")
    if low is not None and high is not None and low > high:
        raise InputError(f"{where}: low {low} > high {high}", hint="swap them")
    if spec.get("log") and low is not None and low <= 0:
        raise InputError(f"{where}: a log range needs low > 0, not {low}",
                         hint="raise low (e.g. 1), or drop 'log: true'")
    if step is not None and step <= 0:
        raise InputError(f"{where}: step must be positive, not {step}",
                         hint="e.g. step: 0.05")
    if step is not None and spec.get("log"):
        raise InputError(f"{where}: a range takes log or step, not both",
                         hint="drop one of them")


def apply_overrides(
    params: list[Param], ov: SpaceOverride, extra: Mapping[str, JSONObject] | None = None
) -> tuple[list[Param], Params]:
    """Return (tunable params, fixed values).  ``extra`` describes the
    installed engine's other flags ({dest: {kind, choices, ...}}): a space file
    may tune or fix any of them.  Unknown names fail with the nearest names."""
    by_name = {p.name: p for p in params}
    known = {**{name: _other_flag(name, info) for name, info in (extra or {}).items()
                if name not in by_name}, **by_name}
    fixed: Params = {}
    out = dict(by_name)
    for name, spec in ov.entries.items():
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
            raise InputError(
                f"--space {ov.source}: unknown parameter {name!r}",
                hint=("did you mean " + ", ".join(close) + "? " if close else "")
                + "tuned by default: " + ", ".join(sorted(by_name)),
            )
        p = known[name]
        where = f"--space {ov.source}: {name}"
        if isinstance(spec, list):
            if not spec:
                raise InputError(f"{where}: empty list of choices", hint="list at least one value")
            for v in spec:
                _check_value(p, v, where)
            out[name] = Param(name, "choice", choices=tuple(spec), target=p.target,
                              help=p.help)
        elif isinstance(spec, dict):
            out[name] = _range(p, spec, where, tuned=name in by_name)
        else:
            _check_value(p, spec, where)
            fixed[name] = spec
            out.pop(name, None)
    return list(out.values()), fixed


def _other_flag(name: str, info: dict[str, Any]) -> Param:
    """A flag of the installed engine outside its default space, as a space
    file may tune or fix it ({kind, choices, ...} as the engine's CLI reads)."""
    kind = {"bool": "bool", "flag": "bool", "int": "int", "float": "float",
            "choice": "choice"}.get(str(info.get("kind")), "str")
    if kind in ("int", "float"):
        return Param(name, kind, low=0, high=2**62)
    if kind == "choice":
        return Param(name, "choice", choices=tuple(info["choices"]))
    return Param(name, kind)


def _range(p: Param, spec: dict[str, Any], where: str, *, tuned: bool) -> Param:
    """A space file's range (low/high/log/step) for numeric param ``p``;
    ``tuned``: p has a default range the missing bounds come from."""
    name = p.name
    extra_keys = set(spec) - {"low", "high", "log", "step"}
    if extra_keys or p.kind not in ("int", "float"):
        raise InputError(
            f"{where}: a range takes low/high/log/step on a numeric parameter",
            hint=f"{name} is {p.kind}"
            + (f"; unknown keys {sorted(extra_keys)}" if extra_keys else ""),
        )
    if not tuned and ("low" not in spec or "high" not in spec):
        raise InputError(f"{where}: give both low and high",
                         hint=f"{name} is not tuned by default, so it has no range")
    low = spec.get("low", p.low)
    high = spec.get("high", p.high)
    for v in (low, high):
        _check_value(p, v, where)
    # _check_value rejects None for a numeric kind; this tells the checker.
    assert low is not None and high is not None
    if low > high:
        raise InputError(f"{where}: low {low} > high {high}", hint="swap them")
    if bool(spec.get("log", p.log)) and low <= 0:
        raise InputError(f"{where}: a log range needs low > 0, not {low}",
                         hint="raise low (e.g. 1), or drop 'log: true'")
    return Param(name, p.kind, low=low, high=high, log=bool(spec.get("log", p.log)),
                 step=spec.get("step", p.step), target=p.target, help=p.help)


def _check_value(p: Param, v: Any, where: str) -> None:
    ok = {
        "str": isinstance(v, (str, int, float)) and not isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "float": isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": isinstance(v, bool),
        "choice": v in p.choices,
    }[p.kind]
    if not ok:
        want = {"str": "a string", "int": "an integer", "float": "a number",
                "bool": "true or false",
                "choice": "one of " + ", ".join(map(str, p.choices))}[p.kind]
        raise InputError(f"{where}: {v!r} is not valid", hint=f"{p.name} takes {want}")


@dataclass
class TuneConfig:
    model: str | None = None
    engine: str = "vllm"
    engine_python: str | None = None
    trials: int = 10
    workload: Workload = field(default_factory=Workload)
    objective: str = "e2e_p99"
    slo: list[SLO] = field(default_factory=list)
    space_file: Path | None = None
    study: str | None = None
    storage: str | None = None
    studies_dir: Path = Path("studies")
    out: Path | None = None
    profiles_dir: Path = Path("profiles")
    max_model_len: int | None = None
    startup_timeout: float = 600.0
    seed: int = 0
    sampler: str = "tpe"
    memory_check: bool = True  # skip configs predicted not to fit
    confirm: Confirmation = field(default_factory=Confirmation)
    time_budget: float | None = None  # seconds for the whole study
    pick: int | None = None  # write this trial's profile instead of the best
    quality: QualityGate = field(default_factory=QualityGate)
    # Prune only past best x (1 + margin): the best so far is a single run,
    # often a lucky one (on the 2-core VM, picks re-measured 6-45% above the
    # value their search saw), and a pruned trial keeps no value to confirm.
    prune_margin: float = 0.1
    # pareto: loads (req/s, or streams with --concurrency) each launched
    # config is measured at, on its one server; the workload is the highest.
    levels: tuple[float, ...] = ()
    force: bool = False  # replace a read-only --out
    fleet: Fleet = field(default_factory=Fleet)
    capacity: CapacitySearch = field(default_factory=CapacitySearch)
    # auto: after the main search, try the engine's speculative decoding on
    # the best config (real weights only); off: never (qtune.search.speculative)
    speculative: str = "auto"

    @property
    def flow(self) -> str:
        """Which of the runner's flows this run is: "pick" writes one trial's
        profile of a finished study, "finish" concludes a study its workers
        ran, "search" opens or joins one and samples (``qtune.search.runner``).
        ``check_config`` refuses --pick with --finish."""
        if self.pick is not None:
            return "pick"
        return "finish" if self.fleet.finish else "search"


# Study names become file and folder names under studies/ and profiles/:
# a safe alphabet, no separators, no leading dot (hidden, or "..") and short
# enough that "<name>.log" fits a 255-byte file name with room to spare.
STUDY_NAME_MAX = 120
_STUDY_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def check_study_name(name: str, flag: str = "--study") -> str:
    shown = printable(name)[:60] + ("..." if len(name) > 60 else "")
    if not name or not _STUDY_NAME_RE.fullmatch(name) or ".." in name \
            or len(name) > STUDY_NAME_MAX:
        raise StudyError(
            f"{flag} {shown!r}: not a study name",
            hint=f"use letters, digits, '.', '_' and '-' (up to {STUDY_NAME_MAX}, not "
            "starting with '.', no '..'): a study's files live under studies/ and "
            "profiles/ by that name",
        )
    return name


def check_positive(value: float | None, flag: str, hint: str) -> None:
    """A finite number above 0, or None (unset)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} must be a finite number above 0, not {value}",
                         hint=hint)


# Optuna's samplers seed numpy, which takes 0 .. 2**32 - 1.
SEED_MAX = 2**32 - 1


def check_config(cfg: TuneConfig) -> None:
    """The flags' values on their own, before any file is read or process
    started."""
    if not 0 <= cfg.seed <= SEED_MAX:
        raise InputError(f"--seed {cfg.seed}: out of range",
                         hint=f"a seed is 0 .. {SEED_MAX}")
    check_positive(cfg.startup_timeout, "--startup-timeout",
                   "seconds a server may take to become ready, e.g. 600")
    check_positive(cfg.time_budget, "--time-budget", "minutes, e.g. 60")
    if cfg.max_model_len is not None and cfg.max_model_len < 1:
        raise InputError(f"--max-model-len {cfg.max_model_len}: must be at least 1",
                         hint="tokens of context, e.g. 4096")
    for group in (cfg.confirm, cfg.quality, cfg.fleet, cfg.capacity):
        group.check()
    if cfg.pick is not None and cfg.pick < 0:
        raise InputError(f"--pick {cfg.pick}: trial numbers start at 0",
                         hint="qtune report STUDY lists the trials")
    if cfg.speculative not in ("auto", "off"):
        raise InputError(f"--speculative {cfg.speculative}: not a choice",
                         hint="auto (try it on the best config, real weights only) or off")
    if cfg.study is not None:
        check_study_name(cfg.study)
    if cfg.fleet.finish and cfg.study is None:
        raise InputError("--finish needs --study NAME",
                         hint="--finish confirms and writes the profile of a named study")
    if cfg.fleet.finish and cfg.pick is not None:
        raise InputError("--finish and --pick: choose one",
                         hint="--pick writes one trial's profile; --finish confirms the "
                         "top configs first")


def parse_levels(text: str | None) -> tuple[float, ...]:
    """``--levels 2,4,8`` → (2.0, 4.0, 8.0)."""
    if not text:
        return ()
    try:
        if not text.isascii():  # float() reads '٣' as 3: no flag of ours does
            raise ValueError
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"--levels: cannot read {text!r}",
                         hint="comma-separated loads, e.g. --levels 2,4,8") from None
    return check_levels(vals)


def check_levels(levels: tuple[float, ...]) -> tuple[float, ...]:
    """Two or more different positive, finite loads, sorted and without
    repeats."""
    if not all(math.isfinite(v) for v in levels):
        raise InputError("--levels " + ",".join(f"{v:g}" for v in levels) + ": loads "
                         "must be finite numbers",
                         hint="e.g. --levels 2,4,8 (req/s, or streams with --concurrency)")
    out = tuple(sorted(set(levels)))
    if len(out) < 2 or out[0] <= 0:
        raise InputError("--levels " + ",".join(f"{v:g}" for v in levels) + ": give "
                         "two or more different positive loads",
                         hint="e.g. --levels 2,4,8 (req/s, or streams with --concurrency)")
    return out

