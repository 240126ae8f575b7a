"""Read a user's YAML mapping (space, workload, profile) with one-line errors.

The loader is bounded (``BoundedLoader``): aliases are refused (a few
nested anchors expand to billions of nodes in whatever walks the result),
nesting is limited, a key given twice is an error (PyYAML silently keeps the
last one, so a reviewer and qtune would read different values), and the file
is size-capped.  Every YAML input qtune reads goes through ``safe_load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from qtune.errors import InputError, QtuneError, printable
from qtune.files import read_text

MAX_YAML_BYTES = 4 << 20  # a profile is a few KB; a space or workload file less
MAX_YAML_DEPTH = 32


class _Refused(yaml.YAMLError):
    def __init__(self, why: str, mark: Any = None) -> None:
        super().__init__(why)
        self.why = why
        self.problem_mark = mark


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases, with a depth limit and unique keys."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()  # type: ignore[no-untyped-call]
            raise _Refused("uses a YAML alias (*name); write the value out", ev.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                ev = self.peek_event()  # type: ignore[no-untyped-call]
                raise _Refused(f"nests deeper than {MAX_YAML_DEPTH} levels", ev.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused("uses a merge key (<<); write the values out",
                               key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if dup:
                raise _Refused(f"gives the key {printable(str(key))[:60]!r} twice",
                               key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with ``BoundedLoader``'s limits."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_mapping(path: Path, what: str, hint: str,
                 error: type[QtuneError] = InputError) -> dict[str, Any]:
    """``what`` names the file in messages (``--space s.yaml``); an empty
    file is an empty mapping."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # (read_text says why)
    if size > MAX_YAML_BYTES:
        raise error(f"{what}: {printable(str(path))} is {size >> 20} MiB, over the "
                    f"{MAX_YAML_BYTES >> 20} MiB a YAML input may be", hint=hint)
    text = read_text(path, what, hint, error)  # a regular UTF-8 file, or refused
    try:
        data = safe_load(text)
    except _Refused as exc:
        mark = exc.problem_mark
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{what}: {printable(str(path))}{where} {exc.why}", hint=hint) from None
    except (yaml.YAMLError, ConstructorError, ValueError, OverflowError) as exc:
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
