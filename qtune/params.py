"""Named types for what qtune passes around as plain dicts (issue 30,
"typed results"): a config's launch parameters, and the JSON documents a
study stores and ``--json`` prints.

``Params`` is what a trial launches with (``{"max_num_seqs": 64,
"kv_cache_dtype": "fp8"}``): the values Optuna's distributions give (bool,
int, float, str; a --space file may fix no other kind, null included), and
a nested setting's fields (an engine's speculative candidate, vLLM's
``speculative_config``: ``{"method": "ngram", "num_speculative_tokens": 3}``).

``JSONObject`` is a document whose keys are open (a run's summary, a
study's or trial's attributes): any JSON value under a string key, which
Optuna's JSON storage and ``qtune.jsonout`` both round-trip."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

# The nested parts are read-only views (Mapping, Sequence): those are
# covariant, so a dict[str, float] or a list[int] built by typed code is a
# JSONValue as it is (a dict[str, JSONValue] would take only itself).
ParamScalar: TypeAlias = "bool | int | float | str"
ParamValue: TypeAlias = "ParamScalar | Mapping[str, ParamValue]"
Params: TypeAlias = "dict[str, ParamValue]"

JSONValue: TypeAlias = ("bool | int | float | str | None | Sequence[JSONValue] "
                        "| Mapping[str, JSONValue]")
JSONObject: TypeAlias = "dict[str, JSONValue]"
