"""Read a user's YAML mapping (space, workload, profile) with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from qtune.errors import InputError, QtuneError, printable
from qtune.files import read_text


def read_mapping(path: Path, what: str, hint: str,
                 error: type[QtuneError] = InputError) -> dict[str, Any]:
    """``what`` names the file in messages (``--space s.yaml``); an empty
    file is an empty mapping."""
    text = read_text(path, what, hint, error)  # a regular UTF-8 file, or refused
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{what}: {printable(str(path))}{where} is not valid YAML",
                    hint=hint) from None
    except RecursionError:  # deeply nested flow collections ([[[[...)
        raise error(f"{what}: {printable(str(path))} is nested too deeply",
                    hint=hint) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what}: {printable(str(path))} must be a mapping, not a "
                    f"{type(data).__name__}", hint=hint)
    return data
