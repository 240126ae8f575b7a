"""vLLM's own engine arguments, read from the installed vLLM.

The argparse actions that ``EngineArgs.add_cli_args`` creates give every
flag's name, type, choices and default for *that* version (0.32 has 250), so
the space never offers a flag the installed vLLM lacks, and a ``--space``
file can tune any flag a newer vLLM adds.  Importing vLLM takes 10-20 s, so
the answer is cached per version and build.
"""

from __future__ import annotations

from typing import Any

from qtune.engines.base import engine_json
from qtune.host.installed import EngineInstall

_SCRIPT = r"""
import argparse, json, sys
from vllm.engine.arg_utils import EngineArgs
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
EngineArgs.add_cli_args(p)
out = {}
for a in p._actions:
    if not a.option_strings or a.dest in ("help",):
        continue
    t = getattr(a.type, "__name__", None)
    if isinstance(a, argparse.BooleanOptionalAction):
        kind = "bool"
    elif isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        kind = "flag"
    elif a.choices:
        kind = "choice"
    elif t in ("int", "human_readable_int"):
        kind = "int"
    elif t == "float":
        kind = "float"
    else:
        kind = "str"
    default = a.default if isinstance(a.default, (int, float, str, bool, type(None))) else None
    out[a.dest] = {"flag": a.option_strings[0], "kind": kind, "default": default,
                   "choices": [c for c in a.choices] if a.choices else None,
                   "nargs": a.nargs if isinstance(a.nargs, (int, str, type(None))) else None}
# The compilation passes this version knows (not flags of their own): the
# adapter turns one off by name, so it must know the name exists here.
try:
    import dataclasses
    from vllm.config import PassConfig
    if "compilation_config" in out:
        out["compilation_config"]["pass_config_fields"] = [
            f.name for f in dataclasses.fields(PassConfig)]
except Exception:
    pass
# Speculative decoding: the methods this version's SpeculativeConfig accepts
# (its Literal, flattened) and its fields, for the spec phase's candidates.
try:
    import dataclasses, typing
    from vllm.config import speculative as spec
    def flat(t):
        args = typing.get_args(t)
        return [x for a in args for x in flat(a)] if args else [t]
    if "speculative_config" in out:
        out["speculative_config"]["methods"] = sorted(
            {m for m in flat(spec.SpeculativeMethod) if isinstance(m, str)})
        out["speculative_config"]["fields"] = [
            f.name for f in dataclasses.fields(spec.SpeculativeConfig)]
        # suffix decoding needs Arctic Inference, a package of its own
        import importlib.util
        out["speculative_config"]["suffix_installed"] = (
            importlib.util.find_spec("arctic_inference") is not None)
except Exception:
    pass
print("QTUNE-ARGS" + json.dumps(out, default=str))
"""


def engine_args(install: EngineInstall, timeout: float = 180.0) -> dict[str, Any] | None:
    """{dest: {flag, kind, default, choices}} or None when it cannot be read
    (qtune then uses its built-in space for vLLM 0.32)."""
    data: dict[str, Any] | None = engine_json(
        install, f"vllm-{install.version}-{install.build}-args-v3.json", _SCRIPT, timeout)
    return data
