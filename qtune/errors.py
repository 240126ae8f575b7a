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
     └── ServerError       a server that failed to start or died (trial-level;
                           the search catches it, a single `verify` does not)
"""

from __future__ import annotations

import re

# Hugging Face tokens start with "hf_"; other API keys vary.  Anything that
# looks like one is masked before it is printed or written.
_SECRET_RE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{16,})")
SECRET_ENV_NAMES = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)", re.I)


def redact(text: str) -> str:
    """Mask anything that looks like an access token."""
    return _SECRET_RE.sub("***", text)


class QtuneError(Exception):
    """Base of every user-facing error: ``message`` plus an optional ``hint``."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(redact(message))
        self.message = redact(message)
        self.hint = redact(hint) if hint else None

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
