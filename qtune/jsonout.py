"""qtune's one JSON writer: every ``--json`` output and every JSON file
qtune writes goes through ``dumps``.

Strict JSON (RFC 8259) has no NaN or Infinity; Python's ``json`` writes
them by default, and pandas tables (``qtune report``) are full of NaN for
the cells a trial did not measure, so strict parsers (``jq``, JavaScript,
Go) refused ``report --json``.  A non-finite number is written as null: a
figure that was not measured, or has no finite value (a ratio over 0).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None, numpy and
    pandas scalars as Python values, dataclasses as dicts, tuples and sets
    as lists."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):  # numpy.float64 is a float too
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k) if not isinstance(k, (str, int, float, bool)) or k is None
                else k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((strict(v) for v in obj), key=repr)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return strict(dataclasses.asdict(obj))
    if isinstance(obj, PurePath):
        return str(obj)
    item = getattr(obj, "item", None)  # numpy/pandas scalars
    if callable(item):
        try:
            return strict(item())
        except (TypeError, ValueError):
            pass
    if obj.__class__.__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return None
    return str(obj)


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    """``obj`` as strict JSON text (no trailing newline)."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)
