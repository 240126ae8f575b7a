"""Helpers the engine adapters share: the words of a command line (a flag's
words, a flag read back from argv, an abbreviated flag argparse would
expand), what an engine's own Python prints about its arguments (run once,
cached on this host), and a start's failure read from its log by patterns.

Apart from the contract (``qtune.engines.base``), which re-exports them:
they are code adapters call, not hooks an adapter fills in.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qtune.engines.contract_types import Failure
from qtune.host.installed import EngineInstall
from qtune.model import cache_dir

# Flags qtune reads or checks in a profile's argv, of every engine: where the
# server listens and what it serves (emitters publish, health-check and mount
# from them) and the secret-bearing ones (refused in a profile).  A prefix of
# one of them is what argparse (allow_abbrev, vLLM's and SGLang's default)
# reads as the whole flag.
CHECKED_FLAGS = ("--host", "--port", "--model", "--model-path", "--tokenizer",
                 "--tokenizer-path", "--served-model-name", "--uds", "--api-key",
                 "--admin-api-key", "--hf-token", "--token", "--ssl-keyfile",
                 "--ssl-certfile", "--ssl-ca-certs", "--ssl-keyfile-password",
                 "--password", "--secret", "--download-dir", "--config")


def abbreviated_flag(args: Sequence[str], known: Sequence[str] = CHECKED_FLAGS
                     ) -> tuple[int, str, str] | None:
    """The first argument (index, as given, the flag it stands for) that
    argparse would read as an abbreviation of one of ``known``: a long flag
    that is not itself known but a strict prefix of a known one.  None when
    there is none.  Arguments after ``--`` are positional, as for argparse."""
    known_set = set(known)
    for i, a in enumerate(args):
        if a == "--":
            break
        if not a.startswith("--") or len(a) <= 2:
            continue
        name = a.split("=", 1)[0]
        if name in known_set:
            continue
        full = [k for k in known if k.startswith(name)]
        if full:
            return i, name, full[0]
    return None


def int_flag(argv: Sequence[str], flag: str) -> int | None:
    """The value of ``flag`` in a launch command, when it is set there."""
    if flag in argv[:-1]:
        return int(argv[list(argv).index(flag) + 1])
    return None


def cached_engine_json(cache_name: str) -> dict[str, Any] | None:
    """The mapping ``engine_json`` cached under ``cache_name`` on this host,
    or None (never runs the engine)."""
    path = cache_dir() / "engines" / cache_name
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def to_flag(name: str, value: Any, info: Mapping[str, Any] | None = None) -> list[str]:
    """The words that set ``name`` to ``value`` on an engine's command line;
    ``info`` is the installed engine's description of the flag
    (``Engine.read_args``), if known: its ``flag``, its ``kind`` and, for a
    boolean flag with one, its ``negative`` form (``--no-compile``)."""
    flag = info["flag"] if info else "--" + name.replace("_", "-")
    if info and info["kind"] == "flag":
        if value:
            return [flag]
        # store_true has only the positive form; a switch pair has both
        return [info["negative"]] if info.get("negative") else []
    if isinstance(value, Mapping):  # a config given as JSON (--speculative-config)
        return [flag, json.dumps(dict(value), sort_keys=True, separators=(",", ":"))]
    if isinstance(value, bool):
        return [flag] if value else ["--no-" + flag[2:]]
    return [flag, str(value)]


def engine_json(install: EngineInstall, cache_name: str, script: str,
                timeout: float) -> Any:
    """What ``script``, run by the engine's own Python, prints after
    ``QTUNE-ARGS`` (JSON), cached under ``cache_name`` (name it by version and
    build); None when it cannot be run or read.  The engines' argument
    readers use it: importing an engine costs seconds to minutes."""
    if install.python is None:
        return None
    path = cache_dir() / "engines" / cache_name
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    try:
        proc = subprocess.run([install.python, "-c", script], capture_output=True,
                              text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("QTUNE-ARGS")),
                None)
    if proc.returncode != 0 or line is None:
        return None
    try:
        data = json.loads(line[len("QTUNE-ARGS"):])
    except ValueError:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return data


def classify_by_patterns(
    log_text: str, patterns: list[tuple[str, str]], default: str = "crash"
) -> Failure:
    """First matching (regex, reason) wins; the detail is the matching line."""
    for pattern, reason in patterns:
        m = re.search(pattern, log_text, re.M)
        if m:
            start = log_text.rfind("\n", 0, m.start()) + 1
            end = log_text.find("\n", m.end())
            line = log_text[start : end if end >= 0 else None].strip()
            # "(EngineCore pid=1) ERROR 11-29 23:53:35 [core.py:1510] msg" → msg
            line = re.sub(r"^\([^)]*\)\s+[A-Z]+\s+[\d-]+\s+[\d:]+\s+\[[^\]]*\]\s*",
                          "", line)
            return Failure(reason, line[:400])
    lines = [ln.strip() for ln in log_text.strip().splitlines() if ln.strip()]
    # The last line is often a stack frame ("frame #22: _start + 0x25"); the
    # last line that names an error says more.
    errors = [ln for ln in lines if re.search(r"Error\b|Exception\b|error:", ln)]
    pick = errors[-1] if errors else lines[-1] if lines else "no output"
    return Failure(default, pick[-400:])
