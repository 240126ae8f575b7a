"""Read emitted files back the way their real consumers do.

- systemd: the unit file syntax of systemd.syntax(5) and the ExecStart=/
  Environment= rules of systemd.service(5) and systemd.exec(5).  The parser
  accepts a *subset* of what systemd accepts (only the escapes the emitter
  writes: ``\\\\``, ``\\"``, ``\\'`` and a standalone ``\\;``) and fails on
  anything else, so whatever it reads, systemd reads the same way.  Line
  continuation follows the older, stricter rule (a comment line ending in an
  odd run of backslashes continues too), so a unit that reads the same here
  reads the same on every systemd.
- Kubernetes: ``Expand`` of k8s.io/kubernetes third_party/forked/golang/
  expansion/expand.go, byte for byte.
- Compose: compose-go's interpolation: ``$$`` is ``$``, any other ``$``
  substitutes (which the tests treat as a failure).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_WS = " \t\n\r"


class Unreadable(AssertionError):
    """The text is not something the consumer reads unambiguously."""


# -- systemd --------------------------------------------------------------------
@dataclass
class Unit:
    sections: list[str] = field(default_factory=list)
    entries: list[tuple[str, str, str]] = field(default_factory=list)  # section, key, value

    def values(self, section: str, key: str) -> list[str]:
        return [v for s, k, v in self.entries if s == section and k == key]

    def keys(self, section: str) -> list[str]:
        return [k for s, k, _ in self.entries if s == section]


def _odd_trailing_backslashes(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def parse_unit(text: str) -> Unit:
    unit = Unit()
    section: str | None = None
    pending: str | None = None
    for raw in text.split("\n"):
        if any(c in raw for c in "\r\x00"):
            raise Unreadable("a line holds CR or NUL")
        if pending is not None:
            if raw.lstrip(_WS)[:1] in ("#", ";"):
                # systemd >= 240 skips it, older versions join it: ambiguous
                raise Unreadable("a comment line inside a continued line")
            line = pending + raw
        else:
            line = raw
        if _odd_trailing_backslashes(line):
            pending = line[:-1] + " "
            continue
        pending = None
        s = line.strip(_WS)
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            if not s.endswith("]"):
                raise Unreadable("bad section header")
            section = s[1:-1]
            unit.sections.append(section)
            continue
        if section is None:
            raise Unreadable("assignment outside of a section")
        key, eq, value = s.partition("=")
        if not eq:
            raise Unreadable("a line with no '='")
        unit.entries.append((section, key.strip(_WS), value.strip(_WS)))
    if pending is not None:
        raise Unreadable("the file ends inside a continued line")
    return unit


def specifiers(text: str) -> str:
    """``%%`` is ``%``; any other specifier would expand: refused."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "%":
            if text[i + 1:i + 2] != "%":
                raise Unreadable("a % specifier would expand")
            out.append("%")
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _words(text: str, exec_line: bool) -> list[str]:
    """extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), repeated, with
    config_parse_exec's raw ``;`` / ``\\;`` checks when ``exec_line``."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return words
        if exec_line:
            rest = text[i:]
            if rest[0] == ";" and (len(rest) == 1 or rest[1] in _WS):
                raise Unreadable("a lone ';' starts a second command")
            if rest[:2] == "\\;" and (len(rest) == 2 or rest[2] in _WS):
                words.append(";")
                i += 2
                continue
        word: list[str] = []
        quote: str | None = None
        while i < n:
            c = text[i]
            if quote is None and c in _WS:
                break
            if c == "\\":
                nxt = text[i + 1:i + 2]
                if nxt not in ('\\', '"', "'"):
                    raise Unreadable("an escape the emitter never writes")
                word.append(nxt)
                i += 2
                continue
            if quote is None and c in "\"'":
                quote = c
            elif quote is not None and c == quote:
                quote = None
            else:
                word.append(c)
            i += 1
        if quote is not None:
            raise Unreadable("an unterminated quote")
        words.append("".join(word))


def env_dollars(word: str) -> str:
    """systemd's run-time $ handling in ExecStart: ``$$`` is ``$``;
    ``$NAME`` and ``${NAME}`` would expand: refused."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            if word[i + 1:i + 2] != "$":
                raise Unreadable("a $ would expand")
            out.append("$")
            i += 2
            continue
        out.append(word[i])
        i += 1
    return "".join(out)


def assert_systemd_verifies(unit: Path, text: str | None = None) -> None:
    """The real ``systemd-analyze verify`` accepts the unit file (written
    first when ``text`` is given) and says nothing about it."""
    if text is not None:
        unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no",
                        str(unit)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert unit.name not in r.stderr, r.stderr


def exec_start_argv(value: str) -> list[str]:
    """What systemd executes for one ExecStart= value."""
    return [env_dollars(w) for w in _words(specifiers(value), exec_line=True)]


def environment(values: list[str]) -> dict[str, str]:
    """Environment= lines as systemd assigns them (no $ expansion there;
    specifiers expand after unquoting, which is the same for ``%%``)."""
    env: dict[str, str] = {}
    for value in values:
        for word in _words(value, exec_line=False):
            word = specifiers(word)
            k, eq, v = word.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise Unreadable("an invalid environment assignment")
            env[k] = v
    return env


# -- Kubernetes -----------------------------------------------------------------
def k8s_expand(text: str, mapping: Callable[[str], str]) -> str:
    """Expand() of k8s.io/kubernetes third_party/forked/golang/expansion,
    over bytes as Go does."""
    data = text.encode()
    buf = bytearray()
    checkpoint = 0
    cursor = 0
    while cursor < len(data):
        if data[cursor:cursor + 1] == b"$" and cursor + 1 < len(data):
            buf += data[checkpoint:cursor]
            read, is_var, advance = _try_read_variable_name(data[cursor + 1:])
            buf += mapping(read.decode("utf-8", "surrogateescape")).encode(
                "utf-8", "surrogateescape") if is_var else read
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return (bytes(buf) + data[checkpoint:]).decode("utf-8", "surrogateescape")


def _try_read_variable_name(data: bytes) -> tuple[bytes, bool, int]:
    if data[0:1] == b"$":
        return b"$", False, 1
    if data[0:1] == b"(":
        for i in range(1, len(data)):
            if data[i:i + 1] == b")":
                return data[1:i], True, i + 1
        return b"$(", False, 1
    # Go: string(operator) + string(input[0]): a byte read as a rune
    return b"$" + chr(data[0]).encode(), False, 1


def k8s_expand_all(text: str) -> str:
    """Worst case: every variable name is defined (a pod's env, the
    Service links Kubernetes injects), so any reference changes the text."""
    return k8s_expand(text, lambda name: f"<expanded {name}>")


# -- Compose --------------------------------------------------------------------
def compose_unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "$":
            if text[i + 1:i + 2] != "$":
                raise Unreadable("compose would interpolate a $")
            out.append("$")
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)
