"""``qtune search --engine sglang|tgi`` up to the first launch: the study is
prepared from the installed engine's arguments, and a --space file may set
any flag that version has."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from qtune.engines import ENGINES
from qtune.engines import probe_host as probe
from qtune.engines.tgi import parse_help
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.search.config import TuneConfig
from qtune.search.inputs import prepare
from tests.engines.conftest import ENG_FIX, H200X2, replay_nvml
from tests.fakes.model import make_model

ARGS = {
    "sglang": json.loads((ENG_FIX / "sglang-0.5.17-server-args.json").read_text()),
    "tgi": parse_help((ENG_FIX / "tgi-3.3.7-launcher-help.md").read_text()),
}
# a flag each version has that the default space leaves alone
EXTRA = {"sglang": ("page_size", 64, "--page-size"),
         "tgi": ("max_batch_total_tokens", 65536, "--max-batch-total-tokens")}


@pytest.mark.parametrize("name", ["sglang", "tgi"])
def test_a_study_is_prepared_from_the_installed_engine_s_arguments(name, tmp_path,
                                                                   monkeypatch):
    import qtune.search.inputs as inputs

    install = EngineInstall(name, "0", "cuda", sys.executable, "/usr/bin/x")
    host = dataclasses.replace(
        probe(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable),
        engines=InstalledEngines(sys.executable, [install]))
    monkeypatch.setattr(inputs, "probe", lambda **kw: host)
    engine = ENGINES[name]
    monkeypatch.setattr(engine, "read_args", lambda install: ARGS[name])
    dest, value, flag = EXTRA[name]
    space = tmp_path / "space.yaml"
    space.write_text(f"{dest}: {value}\n")
    cfg = TuneConfig(engine=name, model=str(make_model(tmp_path / "m")), trials=3,
                     space_file=space, max_model_len=4096,
                     workload=Workload(input_len=512, output_len=64, concurrency=8),
                     studies_dir=tmp_path / "studies", profiles_dir=tmp_path / "profiles")
    prep = prepare(cfg)
    assert prep.engine is engine and prep.ctx.engine_args == ARGS[name]
    assert {p.name for p in prep.params} == {p.name for p in engine.space(prep.ctx)}
    assert prep.fixed == {dest: value}
    spec = engine.launch_spec({**prep.fixed}, prep.ctx, host="127.0.0.1", port=9)
    assert spec.argv[list(spec.argv).index(flag) + 1] == str(value)
