"""The launch profile: the stable contract between the search and emitters.

A profile says exactly how to start the winning server (``argv``, ``env``)
and why it won (``metrics`` against the baseline, ``workload``, ``slo``,
``host``, ``study``).  Emitters read only this file, so last month's profile
can be emitted without re-probing.  Files are written atomically; secrets
are refused at validation.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from qtune.errors import SECRET_ENV_NAMES, ProfileError, redact
from qtune.yamlfile import read_mapping

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    # Inputs stay out of error texts: they may hold a token.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class EngineInfo(_Strict):
    name: str
    version: str
    build: str


class StudyRef(_Strict):
    storage: str
    name: str
    trial: int
    trials_run: int
    baseline_trial: int | None = None


class Profile(_Strict):
    schema_version: int = SCHEMA_VERSION
    name: str
    created: str
    qtune_version: str
    engine: EngineInfo
    model: dict[str, Any]
    params: dict[str, Any]
    env: dict[str, str]
    argv: list[str]
    metrics: dict[str, Any]
    workload: dict[str, Any]
    slo: list[str]
    host: dict[str, Any]
    study: StudyRef
    notes: list[str] = []
    # NUMA node and CPUs to run on, from the probe at tuning time
    # (qtune.host.placement); numa_node None means "no placement".
    placement: dict[str, Any] | None = None

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("argv is empty")
        if not os.path.isabs(v[0]):
            raise ValueError(f"argv[0] must be an absolute path, got {v[0]!r}")
        for a in v:
            if redact(a) != a:
                raise ValueError("argv holds what looks like an access token")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if SECRET_ENV_NAMES.search(k) or redact(val) != val:
                raise ValueError(
                    f"env {k} looks like a secret; secrets go in an EnvironmentFile"
                )
        return v

    @field_validator("schema_version")
    @classmethod
    def _schema(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is not supported (want {SCHEMA_VERSION})")
        return v

    # -- files ----------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Profile:
        data = read_mapping(path, "profile", "profiles are written by `qtune search` "
                            "under profiles/", ProfileError)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            raise ProfileError(
                f"profile {path}: {loc}: {err['msg']}",
                hint="profiles are written by `qtune search`; re-run it or fix the field",
            ) from None

    def dump(self) -> str:
        return yaml.safe_dump(
            self.model_dump(mode="json"), sort_keys=False, default_flow_style=False,
            width=100,
        )

    def save(self, path: Path) -> None:
        write_atomic(path, self.dump())


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: a
    reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            # mkstemp makes the file 0600; give it the mode a plain open()
            # would (or the replaced file's), so a team can read profiles
            # and units.
            try:
                mode = path.stat().st_mode & 0o777
            except FileNotFoundError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
