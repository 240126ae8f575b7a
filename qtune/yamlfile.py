"""Read a user's YAML mapping (space, workload, profile) with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from qtune.errors import InputError, QtuneError


def read_mapping(path: Path, what: str, hint: str,
                 error: type[QtuneError] = InputError) -> dict[str, Any]:
    """``what`` names the file in messages (``--space s.yaml``); an empty
    file is an empty mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise error(f"{what}: cannot read {path}: {exc.strerror}", hint=hint) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{what}: {path}{where} is not valid YAML", hint=hint) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what}: {path} must be a mapping, not a {type(data).__name__}",
                    hint=hint)
    return data
