"""One source of truth in a profile: its ``params`` against its ``argv``.

A profile carries the winning config twice: ``params`` (what the search
chose, what the report and the capacity figures name) and ``argv`` (what
emit writes into every unit).  Edited by hand, they drift apart: changing
``params.max_num_seqs`` to 64 while argv keeps ``--max-num-seqs 231`` used
to emit 231 without a word.  So a profile is checked on load:

- every param is found in the command as its engine's adapter writes it
  (the flag, ``--no-flag`` for a false switch, a JSON config as a mapping
  that holds the param's keys, an upper-case name as an environment
  variable) with the same value; a value the adapter leaves out of the
  command (``Engine.leaves_out``: ``quantization: none``, say) must be
  absent from it;
- every param's value has the type the engine's own argument parser gives
  the flag (``Engine.cached_args``: the installed engine's argparse, as
  qtune read it at tuning time on this host): ``max_num_seqs: fast`` is
  refused, and so is a choice the engine does not offer.

Flags in argv that no param names are the fixed part of the command (the
model, the address, the load format) and are not compared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from qtune.errors import ProfileError

_HINT = ("params and argv say the same config twice: make them agree (re-run qtune "
         "search, or edit both)")
_ABSENT = object()


def _norm(flag: str) -> str:
    # argparse in vLLM and SGLang takes --max_num_seqs for --max-num-seqs
    return flag.replace("_", "-")


def argv_value(argv: Sequence[str], flag: str) -> object:
    """What ``argv`` sets ``flag`` to, argparse's way (the last one wins):
    a string, True for a bare switch, False for ``--no-flag``, or _ABSENT."""
    want, neg = _norm(flag), "--no-" + _norm(flag)[2:]
    found: object = _ABSENT
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        key, eq, val = word.partition("=")
        key = _norm(key)
        if key == neg:
            found = False
        elif key == want:
            if eq:
                found = val
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found = argv[i + 1]
            else:
                found = True
    return found


def _show(value: object) -> str:
    if value is _ABSENT:
        return "(not in argv)"
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _holds(big: object, small: object) -> bool:
    """``big`` has every key of ``small`` with an equal value (a config the
    adapter merged more into, e.g. the all-reduce pass turned off)."""
    if isinstance(small, Mapping):
        return isinstance(big, Mapping) and all(
            k in big and _holds(big[k], v) for k, v in small.items())
    return _same_scalar(big, small)


def _same_scalar(got: object, want: object) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, (int, float)):
        try:
            g = float(got) if isinstance(got, (str, int, float)) else math.nan
        except ValueError:
            return False
        return math.isclose(g, float(want), rel_tol=1e-9, abs_tol=0.0)
    return got == want


def _agrees(got: object, want: Any) -> bool:
    if isinstance(want, bool):
        if got is _ABSENT:
            return want is False  # a switch left off
        if isinstance(got, str) and got.lower() in ("true", "false"):
            return (got.lower() == "true") == want  # TGI writes --flag true
        return got is want
    if got is _ABSENT or isinstance(got, bool):
        return False
    if isinstance(want, Mapping):
        try:
            return _holds(json.loads(str(got)), want)
        except ValueError:
            return False
    if isinstance(want, (int, float)):
        return _same_scalar(got, want)
    return str(got) == str(want)


def _type_error(name: str, value: Any, info: Mapping[str, Any], engine: str) -> str | None:
    """Why ``value`` is not of the engine's own type for ``name``, or None."""
    kind = info.get("kind")
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"is {_show(value)!r}, and {engine} takes an integer for {info.get('flag')}"
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"is {_show(value)!r}, and {engine} takes a number for {info.get('flag')}"
    if kind in ("bool", "flag") and not isinstance(value, bool):
        return f"is {_show(value)!r}, and {info.get('flag')} is a switch (true or false)"
    choices = info.get("choices")
    if kind == "choice" and choices and str(value) not in {str(c) for c in choices}:
        shown = ", ".join(str(c) for c in list(choices)[:12])
        return f"is {_show(value)!r}, not one of {engine}'s choices ({shown})"
    # "str": the engine parses the text itself (vLLM's --max-model-len takes
    # 2048 as well as 2k): a number is text on a command line, a switch is not.
    if kind == "str" and (isinstance(value, bool)
                          or not isinstance(value, (str, int, float, Mapping))):
        return f"is {_show(value)!r}, and {engine} takes text for {info.get('flag')}"
    return None


def check_sources(profile: Any, where: str,
                  engine_args: Mapping[str, Any] | None = None) -> None:
    """Refuse a profile whose params and argv disagree, or whose param
    values the engine's argument parser would refuse (``engine_args``;
    the adapter's cached copy of the installed engine's when not given)."""
    from qtune.engines import ENGINES

    engine = ENGINES.get(profile.engine.name)
    if engine is None:
        return  # an engine qtune has no adapter for: its flags are unknown
    args = engine_args if engine_args is not None else engine.cached_args(
        profile.engine.version, profile.engine.build)
    label = f"{profile.engine.name} {profile.engine.version}"
    for name, value in sorted(profile.params.items()):
        field = f"profile {where}: params.{name}"
        if value is None:
            continue
        if name.isupper():  # an environment variable of the server
            got = profile.env.get(name, _ABSENT)
            if engine.leaves_out(name, value):
                ok = got is _ABSENT
            else:
                ok = got is not _ABSENT and _agrees(got, value)
            if not ok:
                raise ProfileError(f"{field} is {_show(value)} but env.{name} is "
                                   f"{_show(got).replace('(not in argv)', '(not set)')}",
                                   hint=_HINT)
            continue
        info = (args or {}).get(name)
        if args is not None and info is None:
            raise ProfileError(f"{field}: {label} has no such argument",
                               hint="a param is one of the engine's arguments (its "
                                    "dest: the flag's name in snake_case); re-run "
                                    "qtune search")
        if info is not None:
            why = _type_error(name, value, info, label)
            if why:
                raise ProfileError(f"{field} {why}", hint="fix the value in params and "
                                   "argv, or re-run qtune search")
        flag = info["flag"] if info else "--" + name.replace("_", "-")
        got = argv_value(profile.argv, flag)
        if engine.leaves_out(name, value):
            ok = got is _ABSENT
        else:
            ok = _agrees(got, value)
        if not ok:
            raise ProfileError(f"{field} is {_show(value)} but argv has {flag} "
                               f"{_show(got)}", hint=_HINT)
