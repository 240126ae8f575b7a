"""One fleet worker for the tests, in a process of its own: qtune's search
with the stand-in engine (tests.fakes.engine) on the CI host's captured
facts, as ``qtune search`` runs it (signal handlers, one error line).

    python -m tests.fleet.worker '{"study": ..., "storage": ..., ...}'

The JSON holds TuneConfig's fields, a group's by their flag names
(``confirm_top``; qtune.options.grouped), and ``engine_version``, to play a
host with another engine; the last stdout line is a JSON summary.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from qtune.engines import ENGINES
from qtune.engines import probe_host as probe
from qtune.errors import QtuneError
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.options import grouped
from qtune.search import NullReporter, prepare, run_study
from qtune.search.config import TuneConfig
from qtune.server import install_signal_handlers
from tests.fakes.engine import FakeEngine
from tests.fakes.nvml import NoNVML

FIX = Path(__file__).parent.parent / "fixtures"


def main(arg: str) -> int:
    import qtune.search.inputs as inputs

    spec = json.loads(arg)
    version = spec.pop("engine_version", "1.0")
    ENGINES["fake"] = FakeEngine()
    host = probe(root=FIX / "hosts" / "epyc-2c-1node", nvml=NoNVML(),
                 engine_python=sys.executable)
    host = dataclasses.replace(host, engines=InstalledEngines(
        sys.executable, [EngineInstall("fake", version, "cpu", sys.executable)]))
    inputs.probe = lambda **kw: host  # type: ignore[assignment]
    install_signal_handlers()
    wl = Workload(**spec.pop("workload"))
    for key in ("space_file", "out"):
        if spec.get(key):
            spec[key] = Path(spec[key])
    cfg = TuneConfig(engine="fake", workload=wl, studies_dir=Path(spec.pop("studies_dir")),
                     profiles_dir=Path(spec.pop("profiles_dir")), **grouped(spec))
    try:
        res = run_study(prepare(cfg), NullReporter())
    except QtuneError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps({"profile": str(res.profile_path) if res.profile_path else None,
                      "stop_reason": res.stop_reason}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
