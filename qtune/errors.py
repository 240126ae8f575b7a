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

# Shapes of common access tokens, masked before anything is printed or
# written.  Lengths are the shortest each issuer hands out, less a margin:
# a short "hf_" value (6+) is still a token, a 5-letter word after "sk-" is not.
# Every pattern here starts with a literal (or a bounded name) and has no
# nested repetition: the scan is linear in the text's length (a 64 KB value
# must cost milliseconds, not seconds).
_TOKEN_SHAPES = (
    r"hf_[A-Za-z0-9]{6,}",  # Hugging Face
    r"gh[poushr]_[A-Za-z0-9]{20,}",  # GitHub classic tokens (ghp_, gho_, ghs_...)
    r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI and look-alikes
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
    r"(?:AKIA|ASIA)[A-Z0-9]{16}",  # AWS access key ids
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWTs
)
_SECRET_RE = re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(_TOKEN_SHAPES) + r")")
# "Authorization: Bearer X" / "Basic X" as echoed in errors and logs.
_AUTH_RE = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{6,}")
# Secret-named parameters, in a URL query (?password=), a libpq string
# (password=x host=y), a form or a flag (--api-key=x): the name is bounded
# (40 characters before the secret word) so no position starts a long scan.
SECRET_WORDS = ("password", "passwd", "pwd", "pass", "passphrase", "token", "secret",
                "api_key", "apikey", "api-key", "access_token", "access-key",
                "access_key", "private_key", "key", "auth", "authorization",
                "credential", "credentials", "signature", "sig", "sas", "session")
_PARAM_RE = re.compile(
    r"(?i)(?<![A-Za-z0-9_/.])(?P<name>[A-Za-z0-9_.-]{0,40}?(?:"
    + "|".join(re.escape(w) for w in sorted(SECRET_WORDS, key=len, reverse=True))
    + r"))(?P<eq>['\"]?(?:\s*=\s*|\s*:\s+|\s*:(?=['\"]))|%3[dD])"
    r"(?P<q>['\"]?)(?P<val>[^\s&;#'\",}]+)")
# Flags whose *next* argument is a secret (--api-key VALUE), by shape: any
# flag whose name holds a secret word (an engine's --api-key, --hf-token,
# --ssl-keyfile-password, --admin-api-key), not a list of one engine's names;
# the word ends the name (--tokenizer is no secret).
_FLAG_RE = re.compile(r"(?<![\w-])(?P<flag>--[a-z0-9-]{0,40}?(?:api-key|token|password|secret))"
                      r"(?P<sp>\s+|['\"],\s*['\"])(?P<val>[^\s'\"]+)")
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}\Z")

SECRET_ENV_NAMES = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)", re.I)
# Control characters in a refused value would let it draw its own lines
# (a fake "hint:") or terminal escapes into an error.
# Unicode line and bidi-override characters too: they reorder or break what
# a terminal shows as much as an escape sequence does.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _mask_userinfo(text: str) -> str:
    """scheme://user:password@host: the password goes, whatever characters
    it holds ('/', '?', '#', '@' too: to the last '@' of the word), the user
    stays (it says which account).  One pass over the text: each '://' is
    found with str.find and its word is scanned once."""
    out: list[str] = []
    pos = 0
    while (i := text.find("://", pos)) >= 0:
        # A scheme is at most 32 characters: look back no further.
        if not _SCHEME_RE.search(text, max(0, i - 32), i):
            out.append(text[pos:i + 3])
            pos = i + 3
            continue
        start = i + 3
        end = start
        n = len(text)
        # To the next whitespace: a password may hold quotes and brackets
        # too (masking a little more of a quoted word is safe, less is not).
        while end < n and not text[end].isspace():
            end += 1
        word = text[start:end]
        at = word.rfind("@")
        colon = word.find(":")
        user = word[:colon]
        if at > 0 and 0 <= colon < at and not any(c in user for c in "/?#"):
            word = word[:colon + 1] + "***" + word[at:]
        elif at > 0 and not any(c in word[:at] for c in "/?#"):
            # user info without a colon may be a bare token (https://TOKEN@host)
            word = "***" + word[at:] if at >= 16 else word
        out.append(text[pos:start] + word)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact(text: str) -> str:
    """Mask anything that looks like a secret: URL user-info passwords,
    secret-named parameters, secret flags' values, token shapes.  Linear in
    ``len(text)``; never raises."""
    text = _mask_userinfo(str(text))  # (str(): a caller's exception text, say)
    text = _AUTH_RE.sub(lambda m: f"{m[1]}{m[2]}***", text)
    text = _PARAM_RE.sub(lambda m: f"{m['name']}{m['eq']}{m['q']}***"
                         if m["val"] != "***" else m[0], text)
    text = _FLAG_RE.sub(lambda m: f"{m['flag']}{m['sp']}***", text)
    return _SECRET_RE.sub("***", text)


# A database (or storage proxy) URL's password as SQLAlchemy reads it: from
# the ':' after the user to the last '@', spaces included (it still
# connects).  Anchored at the start, so one scan: linear.
_DB_USERINFO_RE = re.compile(
    r"(?P<head>(?:postgres(?:ql)?|mysql|mariadb|oracle|mssql|sqlite|grpc)(?:\+\w+)?"
    r"://[^:/]*:).*@", re.S | re.I)


def mask_url(url: str) -> str:
    """``url`` (the whole text is one URL) fit to print: the user-info
    password (whatever characters it holds), secret-named query parameters
    and any token masked.  Never raises, whatever the text."""
    if m := _DB_USERINFO_RE.match(url):
        url = m["head"] + "***@" + url[m.end():]
    return redact(url)


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): one line."""
    return _CONTROL_RE.sub(lambda m: ascii(m[0])[1:-1], text)


def clip(text: str, limit: int) -> str:
    """``text`` no longer than ``limit`` characters, cut at a word with "…"
    (a reason cut mid-word read "it cannot wi" in the HTML report)."""
    if len(text) <= limit:
        return text
    head = text[:max(limit - 1, 1)]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip(" ,;:") + "…"


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
