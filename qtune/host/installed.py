"""Which inference engines are installed, found without importing them:
each engine says what finds it (``Detect``, ``EngineFinder``, implemented
by the ``qtune.engines`` adapters), this module runs the search.

qtune often runs beside an engine installed in another environment, so the
check runs a short script in ``--engine-python`` (default: this Python).
Importing vLLM takes 10+ s and may initialise CUDA; reading package metadata
and torch's ``version.py`` takes milliseconds and tells the build apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from qtune.errors import InputError

# Run in the engine's Python with the engines' ``Detect`` by name as JSON in
# argv[1]: each one's first installed distribution, its module's location and
# the modules it needs beside it; torch's build from its version.py.
_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, os, re, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0], "found": {}}
def dist(*names):
    for n in names:
        try:
            return n, md.version(n)
        except md.PackageNotFoundError:
            pass
    return None, None
torch_cuda = None
spec = importlib.util.find_spec("torch")
if spec and spec.submodule_search_locations:
    p = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        src = open(p).read()
        m = re.search(r"^cuda(?:: \S+)? = '([^']+)'", src, re.M)
        torch_cuda = m.group(1) if m else None
        m = re.search(r"^hip(?:: \S+)? = '([^']+)'", src, re.M)
        out["torch_hip"] = m.group(1) if m else None
    except OSError:
        pass
out["torch"] = {"version": dist("torch")[1], "cuda": torch_cuda}
for engine, d in json.loads(sys.argv[1]).items():
    name, ver = dist(*d["dists"])
    if not name:
        continue
    mspec = importlib.util.find_spec(d["module"]) if d["module"] else None
    out["found"][engine] = {
        "dist": name, "version": ver, "location": mspec.origin if mspec else None,
        "missing": [m for m in d["needs"] if importlib.util.find_spec(m) is None]}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Detect:
    """What finds an engine in a Python, without importing it: its
    distributions (the first installed wins), its module (for its location)
    and the modules it needs beside it to start."""

    dists: tuple[str, ...]
    module: str | None = None
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Found:
    """An engine's distribution as found in a Python."""

    dist: str
    version: str
    location: str | None = None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class PythonFacts:
    """What the detection script found in one Python."""

    python: str
    found: dict[str, Found]
    torch_cuda: str | None = None
    torch_hip: str | None = None

    @property
    def torch_build(self) -> str:
        """The build torch was made for: ``rocm``, ``cuda`` or ``cpu``."""
        return "rocm" if self.torch_hip else "cuda" if self.torch_cuda else "cpu"


@dataclass(frozen=True)
class EngineInstall:
    name: str
    version: str
    build: str  # "cpu", "cuda", "rocm", or "binary"
    python: str | None
    location: str | None = None
    # PYTHONPATH under which the engine was found, when it lives there (a
    # --target install): servers, profiles and units must carry it too.
    pythonpath: str | None = None


@dataclass(frozen=True)
class InstalledEngines:
    python: str
    engines: list[EngineInstall]
    error: str | None = None
    # an engine found but not complete enough to start (what is missing)
    notes: list[str] = field(default_factory=list)
    # False: not looked for (a probe of the hardware only)
    searched: bool = True

    def get(self, name: str) -> EngineInstall | None:
        return next((e for e in self.engines if e.name == name), None)


def pythonpath_of(location: str | None) -> str | None:
    """This PYTHONPATH when the engine was found under it (a --target
    install), so that servers, profiles and units carry it too."""
    pypath = os.environ.get("PYTHONPATH")
    if not pypath or not location:
        return None
    if any(p and location.startswith(os.path.abspath(p)) for p in pypath.split(os.pathsep)):
        return pypath
    return None


class EngineFinder(Protocol):
    """An engine as detection sees it (each ``qtune.engines`` adapter): what
    finds it in a Python (``detect``; None: found another way, as TGI's
    launcher on PATH), and its install from what was found, with notes on
    what it lacks to start."""

    name: str
    detect: Detect | None

    def find_install(self, facts: PythonFacts | None,
                     python: str) -> tuple[EngineInstall | None, list[str]]: ...


def python_facts(python: str, detects: Mapping[str, Detect]) -> PythonFacts:
    """Run the detection script in ``python`` for ``detects`` (by engine
    name); RuntimeError when it cannot."""
    arg = json.dumps({name: dataclasses.asdict(d) for name, d in detects.items()})
    try:
        proc = subprocess.run([python, "-c", _SCRIPT, arg], capture_output=True, text=True,
                              timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1:] or "failed")
        raw = json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(str(exc)) from exc
    found = {name: Found(f["dist"], f["version"], f.get("location"),
                         tuple(f.get("missing") or ()))
             for name, f in (raw.get("found") or {}).items()}
    return PythonFacts(str(raw.get("python") or python), found,
                       (raw.get("torch") or {}).get("cuda"), raw.get("torch_hip"))


def find_engines(python: str, finders: Sequence[EngineFinder]) -> InstalledEngines:
    """Each of ``finders`` as installed for ``python`` (or found on PATH)."""
    engines: list[EngineInstall] = []
    notes: list[str] = []
    error = None
    facts: PythonFacts | None = None
    try:
        facts = python_facts(python, {f.name: f.detect for f in finders
                                      if f.detect is not None})
    except RuntimeError as exc:
        error = f"cannot run {python}: {exc}"
    for finder in finders:
        install, said = finder.find_install(facts, python)
        notes += said
        if install is not None:
            engines.append(install)
    return InstalledEngines(str(Path(python)), engines, error, notes)


def parse_engine_pythons(spec: str, finders: Sequence[EngineFinder]) -> dict[str, str]:
    """``--engine-python``: one Python for every engine (a path), or one per
    engine, ``vllm=/opt/vllm/bin/python,sglang=/opt/sglang/bin/python``:
    vLLM and SGLang pin different torch builds, so they often live in
    separate environments.  ``{"": PATH}`` for the single form."""
    if "=" not in spec:
        return {"": spec}
    in_python = [f.name for f in finders if f.detect is not None]
    out: dict[str, str] = {}
    for part in spec.split(","):
        name, sep, path = part.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not path:
            raise InputError(f"--engine-python: {part!r} is not NAME=PATH",
                             hint="one Python: --engine-python /opt/venv/bin/python; one "
                             "per engine: --engine-python vllm=PATH,sglang=PATH")
        if name in {f.name for f in finders} and name not in in_python:
            raise InputError(f"--engine-python: {name} is found on PATH, not through "
                             "a Python",
                             hint=f"leave {name} out of --engine-python; put its "
                             "launcher on PATH")
        if name not in in_python:
            raise InputError(f"--engine-python: unknown engine {name!r}",
                             hint="engines with a Python: " + ", ".join(in_python))
        if name in out:
            raise InputError(f"--engine-python: {name} named twice",
                             hint="one Python per engine")
        out[name] = path
    return out


def find_engines_for(spec: str | None, default: str,
                     finders: Sequence[EngineFinder]) -> InstalledEngines:
    """The engines of ``--engine-python`` (``parse_engine_pythons``): with
    one Python per engine, each engine is taken from its own Python only,
    and the others from ``default`` (this Python)."""
    pythons = parse_engine_pythons(spec, finders) if spec else {"": default}
    if "" in pythons:
        return find_engines(pythons[""], finders)
    # Each Python is asked for its own engines only, so an engine's notes
    # (what it lacks to start) come from the Python it runs in.
    base = find_engines(default, [f for f in finders if f.name not in pythons])
    engines, notes = list(base.engines), list(base.notes)
    errors = [base.error] if base.error else []
    for python in dict.fromkeys(pythons.values()):
        found = find_engines(python, [f for f in finders if pythons.get(f.name) == python])
        engines += found.engines
        notes += found.notes
        errors += [found.error] if found.error else []
    order = {f.name: i for i, f in enumerate(finders)}
    engines.sort(key=lambda e: order.get(e.name, len(order)))
    label = ", ".join(f"{n}={p}" for n, p in pythons.items())
    return InstalledEngines(label, engines, "; ".join(errors) or None, notes)
