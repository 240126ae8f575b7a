"""Errors qtune shows to a user: one line saying what and where, one hint.

The CLI catches ``QtuneError`` once (``qtune.cli``) and prints it without a
traceback unless ``--debug`` is given.  Everything that is a property of the
*input* (a flag, a file, a model path, a missing engine) is a ``QtuneError``.
A configuration that fails inside a trial is *not* an error: the search
records it as data and goes on.

    QtuneError
     ├── InputError        bad CLI value, space/workload/SLO text, malformed file
     ├── ProfileError      a profile file that does not validate
     ├── ModelError        model path or id that cannot be resolved
     ├── EngineError       engine missing or not runnable from --engine-python
     ├── StudyError        storage or study name problems
     ├── SetupError        a library qtune needs missing, or at an untested version
     ├── UnreachableError  a server to measure that does not answer at all (exit 6)
     └── ServerError       a server that failed to start or died (trial-level;
                           the search catches it, a single `verify` does not)
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# Shapes of common access tokens, masked before anything is printed or
# written.  Lengths are the shortest each issuer hands out, less a margin:
# a short "hf_" value (6+) is still a token, a 5-letter word after "sk-" is not.
_TOKEN_SHAPES = (
    r"hf_[A-Za-z0-9]{6,}",  # Hugging Face
    r"gh[poushr]_[A-Za-z0-9]{20,}",  # GitHub classic tokens (ghp_, gho_, ghs_...)
    r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI and look-alikes
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
    r"(?:AKIA|ASIA)[A-Z0-9]{16}",  # AWS access key ids
)
_SECRET_RE = re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(_TOKEN_SHAPES) + r")")
# scheme://user:password@host: the password goes, the user stays (it says
# which account, and is not a secret by itself).
_USERINFO_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)"
                          r"(?P<pw>[^\s/]*)@")
SECRET_ENV_NAMES = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)", re.I)
# Control characters in a refused value would let it draw its own lines
# (a fake "hint:") or terminal escapes into an error.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def redact(text: str) -> str:
    """Mask anything that looks like an access token or a URL's password."""
    text = _USERINFO_RE.sub(lambda m: m["head"] + "***@", text)
    return _SECRET_RE.sub("***", text)


# A database (or storage proxy) URL's password as SQLAlchemy reads it: from the ':' after the
# user to an '@', with '/', '?', '#', '[' or spaces left unencoded (it still
# connects), where urlsplit ends the user info early or gives up.  To the
# last '@': masking too much is safe, too little is not.
_DB_USERINFO_RE = re.compile(
    r"(?P<head>(?:postgres(?:ql)?|mysql|mariadb|oracle|mssql|sqlite|grpc)(?:\+\w+)?://[^:/]*:)"
    r".*@", re.S | re.I)


def mask_url(url: str) -> str:
    """``url`` fit to print: the user-info password and any token masked.
    Never raises, whatever the text."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            url = parts._replace(netloc=f"{user}:***@{host}").geturl()
    except ValueError:  # e.g. an invalid port or IPv6 literal: mask by pattern
        pass
    if m := _DB_USERINFO_RE.match(url):
        url = m["head"] + "***@" + url[m.end():]
    return redact(url)


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): one line."""
    return _CONTROL_RE.sub(lambda m: ascii(m[0])[1:-1], text)


class QtuneError(Exception):
    """Base of every user-facing error: ``message`` plus an optional ``hint``.
    ``exit_code``: what ``qtune`` exits with (docs/reference/errors.md)."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        message = printable(redact(message))
        super().__init__(message)
        self.message = message
        self.hint = printable(redact(hint)) if hint else None

    def __str__(self) -> str:
        return self.message


class InputError(QtuneError):
    """A flag value, space file, workload file or SLO text is invalid."""


class ProfileError(QtuneError):
    """A profile file is missing, malformed or does not validate."""


class ModelError(QtuneError):
    """The model path or id cannot be resolved locally."""


class EngineError(QtuneError):
    """The engine is not installed, or cannot be run from --engine-python."""


class StudyError(QtuneError):
    """The Optuna storage cannot be opened or the study is inconsistent."""


class SetupError(QtuneError):
    """A library qtune needs is missing, or installed at a version outside
    the range qtune was tested with."""


class UnreachableError(QtuneError):
    """A server qtune was pointed at (``check``, ``bench``) refused the
    connection, timed out or has no route: a cron job tells "down" (6)
    from bad input (1) and a drifted server (4, 5)."""

    exit_code = 6


class ServerError(QtuneError):
    """A server failed to become ready, or died.

    ``reason`` is a short class (``oom``, ``invalid_config``, ``timeout``,
    ``crash``, ``port_in_use``, ``environment``) and ``detail`` the log line
    that explains it.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        detail: str = "",
        log_path: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason
        self.detail = redact(detail)
        self.log_path = log_path

    @property
    def cause(self) -> str:
        """One line: the class and the log line behind it (else the message)."""
        return f"{self.reason}: {self.detail or self.message}"
