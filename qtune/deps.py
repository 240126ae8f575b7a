"""The libraries qtune relies on, at versions it was tested with: checked
at startup, before any file is read or server launched.

The ranges are the ones ``pyproject.toml`` declares (read from the installed
package's metadata, or from the ``pyproject.toml`` beside the package when
it runs from a source tree), and CI runs the fast tests at their floors.
Issue 27: with Optuna 4.5 installed, inside the range then declared, a
capacity study on one H200 ran its first trial for 8 minutes and then failed
on ``Trial.set_constraint`` (new in Optuna 5.0).
"""

from __future__ import annotations

import importlib.metadata as md
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from qtune.errors import SetupError

# Why a floor is where it is, for the error's hint: the API qtune uses.
_WHY = {
    "optuna": "qtune tells Optuna each trial's constraints with Trial.set_constraint "
              "(Optuna 5.0)",
}


def declared() -> list[Requirement]:
    """qtune's direct requirements (extras left out)."""
    try:
        raw = md.requires("qtune") or []
    except md.PackageNotFoundError:
        raw = []
    if not raw:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            raw = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return []
    out = []
    for line in raw:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def problems(reqs: list[Requirement] | None = None) -> list[str]:
    """Each declared requirement that is missing or installed at a version
    outside its range, as ``name VERSION is installed; qtune needs SPEC``."""
    out = []
    for req in declared() if reqs is None else reqs:
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(f"{req.name} is not installed; qtune needs {req}")
            continue
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            continue  # a local build's version qtune cannot read: not judged
        if not ok:
            out.append(f"{req.name} {have} is installed; qtune needs {req}")
    return out


def check() -> None:
    """Refuse to start with a library outside the tested ranges."""
    found = problems()
    if not found:
        return
    name = found[0].split(" ", 1)[0]
    why = _WHY.get(name)
    spec = next((str(r) for r in declared() if r.name == name), name)
    raise SetupError(
        "; ".join(found),
        hint=f"pip install '{spec}'" + (f" ({why})" if why else "")
        + ": qtune is tested at the ranges pyproject.toml declares")
