"""Reading data qtune does not control, bounded: JSON and YAML from files
and servers, and the numbers in them.

Every parse of untrusted text goes through here, so that its limits hold in
one place: a size cap (read no more than it), a nesting-depth cap (checked
before the recursive parser runs, so no RecursionError), finite numbers
only, integers bounded in digits, and for YAML no alias expansion and no
duplicate keys.  A violation is an ``InputError`` naming the source and the
limit, never an internal error.
"""

from __future__ import annotations

import json
import math
from typing import Any

from qtune.errors import InputError, printable, redact

MAX_JSON_BYTES = 16 << 20  # 16 MiB: a /v1/models, config.json or SSE event is far smaller
MAX_DEPTH = 64  # real documents nest under 10 levels
MAX_INT_DIGITS = 30  # a 5000-digit integer is no count, size or port
_DEPTH_SCAN = frozenset("[{")


class BadData(InputError, ValueError):
    """Untrusted data over a limit or malformed: an ``InputError`` for the
    CLI, and a ``ValueError`` for the callers that already handle a bad
    answer as one (a server's reply is parsed where a ValueError is caught)."""


def _depth_ok(text: str | bytes, limit: int) -> bool:
    """Whether brackets nest at most ``limit`` deep, outside strings: one
    linear pass before the (recursive) parser sees the text."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    depth = 0
    in_str = esc = False
    for c in s:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in _DEPTH_SCAN:
            depth += 1
            if depth > limit:
                return False
        elif c in "]}":
            depth -= 1
    return True


def _bad_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(s)} digits")
    return int(s)


def _parse_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"{s[:20]} is not a finite number")
    return v


def loads(text: str | bytes, what: str, *, max_bytes: int = MAX_JSON_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """JSON from an untrusted source: size, depth and number limits, every
    failure an ``InputError`` that names ``what``."""
    if len(text) > max_bytes:
        raise BadData(f"{what}: {len(text)} bytes, over the {max_bytes >> 20} MiB limit",
                         hint="qtune reads small JSON documents only")
    if not _depth_ok(text, max_depth):
        raise BadData(f"{what}: nested deeper than {max_depth} levels",
                         hint="not a document qtune reads")
    try:
        return json.loads(text, parse_constant=_bad_constant, parse_int=_parse_int,
                          parse_float=_parse_float)
    except RecursionError:  # (the depth scan should have caught it)
        raise BadData(f"{what}: nested too deeply", hint="not a document qtune reads") \
            from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadData(f"{what}: not valid JSON ({printable(redact(str(exc)))[:120]})",
                         hint="check the file or the server's answer") from None


def redact_tree(obj: Any) -> Any:
    """A copy of a JSON-like value with every string ``redact``-ed (keys too)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_tree(k) if isinstance(k, str) else k: redact_tree(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_tree(v) for v in obj]
    return obj
