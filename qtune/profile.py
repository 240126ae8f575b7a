"""The launch profile: the stable contract between the search and emitters.

A profile says exactly how to start the winning server (``argv``, ``env``)
and why it won (``metrics`` against the baseline, ``workload``, ``slo``,
``host``, ``study``).  Emitters read only this file, so last month's profile
can be emitted without re-probing.  Files are written atomically.

A profile is input: teams pass them around and scripts write them, and
``qtune emit`` turns them into units that run as root.  So every field is
checked once, here, at load:

- types are strict (``best: "fast"`` is refused, not coerced), and the parts
  emitters read inside the free-form mappings (``placement``, ``model``,
  ``metrics.objective``, ``metrics.startup_s``, the parallel sizes in
  ``params``) have a schema of their own;
- every string anywhere (values and keys, ``notes`` included) is free of
  control characters (C0, C1, DEL), line and paragraph separators (YAML
  breaks lines at U+0085, U+2028 and U+2029), bidi overrides and Unicode
  noncharacters (systemd drops a line that is not valid UTF-8 to it);
- names are in a safe alphabet: env keys are shell identifiers, the profile
  and study names and the engine fields are words;
- secrets are refused: whatever ``redact()`` masks, anywhere; the value of an
  ``--api-key``-like flag; env names like ``*_TOKEN`` and values shaped like
  a token.

Errors name the field, never the value (it may be the secret).
"""

from __future__ import annotations

import math
import posixpath
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from qtune.errors import SECRET_ENV_NAMES, ProfileError, redact
from qtune.yamlfile import read_mapping

SCHEMA_VERSION = 1

_HINT = "profiles are written by `qtune search`; re-run it or fix the field"
_SECRET_HINT = ("secrets never go in a profile: put them in the unit's "
                "EnvironmentFile (or a Kubernetes Secret) and drop them from the profile")

# The profile and study name: it becomes a file, unit and Service name.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
# Engine name, version and build: the version ends up in an image tag.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PARAM_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
# e2e_p99, output_token_throughput, pareto:ttft_p99
_OBJECTIVE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# What a CPU list looks like to the kernel, systemd's CPUAffinity= and
# Docker's cpuset: "0-3,8".
# ASCII digits only: \d takes any Unicode digit ("٠-٣"), which int() reads
# and systemd does not (the unit then fails to parse its affinity).
_CPU_LIST = re.compile(r"[0-9]{1,4}(?:-[0-9]{1,4})?(?:,[0-9]{1,4}(?:-[0-9]{1,4})?)*")
# systemd keeps CPU sets below 8192 CPUs; the kernel's MAX_NUMNODES is 1024.
_MAX_CPU, _MAX_NODE = 8191, 1023
# The executable: absolute, normalised (systemd refuses "/a/../b" and
# "/a//b"), and no character that quoting, `$` or `%` expansion would touch
# (systemd runs the path it parsed, not the expanded argv[0]).
_EXE = re.compile(r"/[A-Za-z0-9._+@:~/-]{1,4095}")
# --api-key X, --api-key=X, --hf-token X, --db-password X, --client-secret X
_SECRET_FLAG = re.compile(
    r"--?(?:[A-Za-z0-9]+[-_])*(?:api[-_]?key|key|token|password|passwd|secret|"
    r"credentials?)", re.I)
# Env names redact() cannot see from the value alone: GH_PAT, *_KEY.
_SECRET_ENV_EXTRA = re.compile(r"(?:^|_)(?:PAT|KEY|PASSWD|CREDENTIALS?)(?:$|_)", re.I)
# A whole value shaped like a token, however short (redact() wants 6+
# characters after "hf_" so that prose is not masked; an env value is no prose).
_TOKEN_VALUE = re.compile(
    r"(?:hf_|gh[poushr]_|github_pat_|xox[abprs]-)[A-Za-z0-9_-]+|sk-[A-Za-z0-9_-]{8,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{12,}")
_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
_MAX_STRING = 65536  # a systemd line is at most 1 MiB; a compile config is a few KB
_MAX_DEPTH = 32
# Every number a profile holds, so that each emitter writes it plainly
# (no exponent past what Go, YAML and JSON readers all take, no inf/NaN).
_MAX_NUMBER = 1e15


def _bad_char(text: str) -> str | None:
    """What is wrong with the first character no deploy file can carry."""
    for ch in text:
        o = ord(ch)
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cs", "Zl", "Zp") or o in _BIDI:
            return f"holds a control or line-break character (U+{o:04X})"
        if 0xFDD0 <= o <= 0xFDEF or (o & 0xFFFE) == 0xFFFE:
            return f"holds a Unicode noncharacter (U+{o:04X})"
    return None


def _show(part: object) -> str:
    """A location part fit for an error line (keys were checked already,
    but a location must never carry more than a short plain word)."""
    s = str(part)
    if s == "(a key)":
        return s
    return s if re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", s) else "[...]"


def _fail(where: tuple[object, ...], what: str, hint: str = _HINT) -> PydanticCustomError:
    return PydanticCustomError("profile_field", "{what}",
                               {"where": tuple(where), "what": what, "hint": hint})


def _check_strings(value: object, where: tuple[object, ...], depth: int = 0) -> None:
    """Every string (keys included) anywhere in ``value``; scalars of the
    kinds YAML and JSON share (no dates, bytes or sets)."""
    if depth > _MAX_DEPTH:
        raise _fail(where, "is nested too deeply")
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, str):
        if len(value) > _MAX_STRING:
            raise _fail(where, f"is longer than {_MAX_STRING} characters")
        bad = _bad_char(value)
        if bad:
            raise _fail(where, bad, "deploy files cannot carry control characters or "
                        "line breaks in a value; remove them from the profile")
        if redact(value) != value:
            raise _fail(where, "holds what looks like an access token or password",
                        _SECRET_HINT)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _fail(where, f"has a key that is a {type(k).__name__}, not a string")
            _check_strings(k, (*where, "(a key)"), depth + 1)
            _check_strings(v, (*where, k), depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_strings(v, (*where, i), depth + 1)
    elif isinstance(value, float) and not (math.isfinite(value) and abs(value) <= _MAX_NUMBER):
        # Anywhere (metrics.best.request_throughput too): inf became
        # "threshold: inf" in KEDA and Infinity in Grafana JSON.
        raise _fail(where, f"must be a finite number within ±{_MAX_NUMBER:g}")
    elif isinstance(value, int) and not isinstance(value, bool) and \
            abs(value) > _MAX_NUMBER:
        raise _fail(where, f"must be a number within ±{_MAX_NUMBER:g}")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise _fail(where, f"is a {type(value).__name__}; profiles hold strings, "
                    "numbers, lists and mappings")


def _schema(model: type[BaseModel]) -> AfterValidator:
    """Validate a free-form mapping's known parts with ``model`` and keep the
    mapping itself (callers read it as a dict).  The error keeps the inner
    location: ``placement.cpus``, not ``placement``."""
    def run(v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        try:
            model.model_validate(v)
        except ValidationError as exc:
            e = exc.errors()[0]
            if e["type"] == "profile_field":
                ctx = e.get("ctx") or {}
                raise _fail((*e["loc"], *ctx["where"]), ctx["what"], ctx["hint"]) from None
            raise _fail(tuple(e["loc"]), e["msg"]) from None
        return v
    return AfterValidator(run)


def _pattern(rx: re.Pattern[str], what: str) -> AfterValidator:
    def run(v: str) -> str:
        if not rx.fullmatch(v):
            raise _fail((), what)
        return v
    return AfterValidator(run)


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise _fail((), "must be a finite number")
    return v


def _cpu_list(v: str) -> str:
    if not _CPU_LIST.fullmatch(v):
        raise _fail((), 'is not a CPU list (like "0-3,8")')
    for part in v.split(","):
        lo, _, hi = part.partition("-")
        if int(hi or lo) < int(lo) or int(hi or lo) > _MAX_CPU:
            raise _fail((), f"is not a CPU list: ranges go up, CPUs up to {_MAX_CPU}")
    return v


Name = Annotated[str, _pattern(_NAME, "must be letters, digits, '.', '_' or '-' "
                                      "(up to 200, starting with a letter or digit)")]
Word = Annotated[str, _pattern(_WORD, "must be letters, digits, '.', '_', '+' or '-'")]
Finite = Annotated[float, AfterValidator(_finite)]
Size = Annotated[int, Field(ge=1, le=1024)]
_SIZE: TypeAdapter[int] = TypeAdapter(Size, config=ConfigDict(strict=True))


class _Strict(BaseModel):
    # Inputs stay out of error texts: they may hold a token.  Strict: a
    # string is never read as a number (or a number as a string).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, strict=True)


class _Open(_Strict):
    """The known keys of a free-form mapping; other keys are kept as they are."""

    model_config = ConfigDict(extra="allow")


class EngineInfo(_Strict):
    name: Word
    version: Word
    build: Word


class StudyRef(_Strict):
    storage: str
    name: Name
    trial: int = Field(ge=0)
    trials_run: int = Field(ge=0)
    baseline_trial: int | None = Field(default=None, ge=0)


class _Placement(_Strict):
    numa_node: int | None = Field(default=None, ge=0, le=_MAX_NODE)
    cpus: Annotated[str, AfterValidator(_cpu_list)] | None = None
    why: str = ""

    @model_validator(mode="after")
    def _cpus_with_node(self) -> _Placement:
        if self.numa_node is not None and self.cpus is None:
            raise _fail(("cpus",), "is needed when numa_node is set")
        return self


class _Model(_Open):
    id: str = Field(min_length=1)
    path: str = Field(min_length=1)
    served_name: str | None = None


class _Objective(_Open):
    name: Annotated[str, _pattern(_OBJECTIVE, "is not an objective name "
                                              "(like e2e_p99 or pareto:ttft_p99)")]
    direction: Literal["minimize", "maximize", "pareto"] | None = None
    # A rate or latency every emitter (KEDA threshold, Grafana JSON) can
    # write as a plain number.
    best: Annotated[Finite, Field(ge=-1e12, le=1e12)] | None = None
    baseline: Annotated[Finite, Field(ge=-1e12, le=1e12)] | None = None


class _Metrics(_Open):
    objective: _Objective | None = None
    # A day: longer is no start qtune measured (1e300 gave a 301-digit
    # TimeoutStartSec, 4x the start, in every unit).
    startup_s: Annotated[Finite, Field(ge=0, le=86400)] | None = None


def _param_keys(v: dict[str, Any]) -> dict[str, Any]:
    for k in v:
        if not _PARAM_KEY.fullmatch(k):
            raise _fail(("(a key)",), "engine parameter names are letters, digits, "
                        "'_', '.' or '-'")
    return v


class Profile(_Strict):
    schema_version: int = SCHEMA_VERSION
    name: Name
    created: str
    qtune_version: str
    engine: EngineInfo
    model: Annotated[dict[str, Any], _schema(_Model)]
    params: Annotated[dict[str, Any], AfterValidator(_param_keys)]
    env: dict[str, str]
    argv: list[str]
    metrics: Annotated[dict[str, Any], _schema(_Metrics)]
    workload: dict[str, Any]
    slo: list[str]
    host: dict[str, Any]
    study: StudyRef
    notes: list[str] = []
    # NUMA node and CPUs to run on, from the probe at tuning time
    # (qtune.host.placement); numa_node None means "no placement".
    placement: Annotated[dict[str, Any] | None, _schema(_Placement)] = None

    @model_validator(mode="before")
    @classmethod
    def _strings(cls, data: Any) -> Any:
        # First, so that a newline or a token is reported as such (and never
        # reaches a message of a later check).
        if isinstance(data, dict):
            _check_strings(data, ())
        return data

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v:
            raise _fail((), "is empty")
        exe = v[0]
        if not _EXE.fullmatch(exe) or posixpath.normpath(exe) != exe or \
                exe.startswith("//") or any(len(p) > 255 for p in exe.split("/")):
            raise _fail((0,), "must be an absolute, normalised path of letters, digits "
                        "and . _ + @ : ~ - /", "re-run qtune search, or name the "
                        "engine's python by a plain path")
        for i, a in enumerate(v):
            flag, eq, val = a.partition("=")
            if eq and flag.startswith("-") and _SECRET_FLAG.fullmatch(flag) and val:
                raise _fail((i,), f"the value of {_show(flag)} is a secret", _SECRET_HINT)
            nxt = v[i + 1] if i + 1 < len(v) else None
            if _SECRET_FLAG.fullmatch(a) and nxt is not None and not nxt.startswith("--"):
                raise _fail((i + 1,), f"the value of {_show(a)} is a secret", _SECRET_HINT)
            if _TOKEN_VALUE.fullmatch(val if eq and flag.startswith("-") else a):
                raise _fail((i,), "looks like an access token", _SECRET_HINT)
        # As the engine's argparse reads it: "--api-ke X" is --api-key X and
        # "--po 9000" is --port 9000 (allow_abbrev), which the checks above
        # and every emitter would miss.
        from qtune.engines.base import abbreviated_flag

        if (bad := abbreviated_flag(v[1:])) is not None:
            i, given, full = bad
            raise _fail((i + 1,), f"{_show(given)} abbreviates {_show(full)}",
                        f"write the flag in full ({_show(full)}): the engine reads a "
                        "prefix as the whole flag, qtune's checks do not")
        return v

    @model_validator(mode="after")
    def _rank_counts(self) -> Profile:
        # The emitters count GPUs from the engine's rank counts (GPUs
        # reserved in Compose and Kubernetes): whole numbers, whichever
        # engine names them (vLLM's tensor_parallel_size, SGLang's tp_size,
        # TGI's num_shard).
        from qtune.engines import ENGINES

        engine = ENGINES.get(self.engine.name)
        for k in engine.rank_params if engine else ():
            if (v := self.params.get(k)) is None:
                continue
            try:
                _SIZE.validate_python(v)
            except ValidationError as exc:
                raise _fail(("params", k), exc.errors()[0]["msg"]) from None
        return self

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not _ENV_KEY.fullmatch(k):
                raise _fail(("(a key)",), "environment names are letters, digits and _, "
                            "not starting with a digit", "systemd, Compose and "
                            "Kubernetes disagree on other names; rename the variable")
            if SECRET_ENV_NAMES.search(k) or _SECRET_ENV_EXTRA.search(k):
                raise _fail((k,), "looks like a secret's name", _SECRET_HINT)
            if _TOKEN_VALUE.fullmatch(val):
                raise _fail((k,), "looks like an access token", _SECRET_HINT)
        return v

    @field_validator("schema_version")
    @classmethod
    def _schema_version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise _fail((), f"{v} is not supported (want {SCHEMA_VERSION})",
                        "this qtune reads profiles of schema "
                        f"{SCHEMA_VERSION}; re-run qtune search")
        return v

    # -- files ----------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Profile:
        data = read_mapping(path, "profile", "profiles are written by `qtune search` "
                            "under profiles/", ProfileError)
        try:
            profile = cls.model_validate(data)
        except ValidationError as exc:
            raise profile_error(path, exc) from None
        from qtune.profile_argv import check_sources

        check_sources(profile, str(path))  # params and argv say the same
        return profile

    def dump(self) -> str:
        return yaml.safe_dump(
            self.model_dump(mode="json"), sort_keys=False, default_flow_style=False,
            width=100,
        )

    def save(self, path: Path) -> None:
        write_atomic(path, self.dump())


def profile_error(path: Path | str, exc: ValidationError) -> ProfileError:
    """One line, ``profile PATH: field.path: what``, and a hint; the value
    is never in it (it may be the secret that was refused)."""
    err = exc.errors()[0]
    loc: tuple[object, ...] = tuple(err["loc"])
    msg, hint = err["msg"], _HINT
    if err["type"] == "profile_field":
        ctx = err.get("ctx") or {}
        loc, msg, hint = (*loc, *ctx["where"]), ctx["what"], ctx["hint"]
    where = ".".join(_show(x) for x in loc) or "(top level)"
    return ProfileError(f"profile {path}: {where}: {msg}", hint=hint)


def write_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Atomic, and refusing devices, symlinks and read-only files: see
    ``qtune.files.write_atomic``."""
    from qtune.files import write_atomic as write

    write(path, text, force=force)
