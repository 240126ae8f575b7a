"""A real small study (the stand-in engine, real processes) rendered by
``qtune report``: the recommendation states the profile's own winner and
gain, with the confirmation it was picked by."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from qtune.engines import ENGINES
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.options import Confirmation
from qtune.profile import Profile
from qtune.search import tune
from qtune.search.config import TuneConfig
from tests.fakes.engine import FakeEngine
from tests.fakes.sampler import script_random_sampler


@pytest.fixture
def fake(monkeypatch, cpu_host, tmp_path):
    import qtune.search.inputs as search

    monkeypatch.setitem(ENGINES, "fake", FakeEngine())
    host = dataclasses.replace(cpu_host, engines=InstalledEngines(
        sys.executable, [EngineInstall("fake", "1.0", "cpu", sys.executable)]))
    monkeypatch.setattr(search, "probe", lambda **kw: host)
    monkeypatch.chdir(tmp_path)
    return TuneConfig(
        engine="fake", trials=4, seed=6, sampler="random",
        workload=Workload(input_len=8, output_len=10, concurrency=2, requests=12,
                          warmup_requests=2),
        studies_dir=tmp_path / "studies", profiles_dir=tmp_path / "profiles",
        study="fake", confirm=Confirmation(top=1, repeats=2), startup_timeout=60)


def test_report_recommends_what_the_search_wrote(fake, monkeypatch, tmp_path):
    from qtune.report import report

    script_random_sampler(monkeypatch, [
        {"delay_ms": 1, "crash": False, "slots": 4},
        {"delay_ms": 1, "crash": True, "slots": 2},  # fails to start
        {"delay_ms": 30, "crash": False, "slots": 3},
        {"delay_ms": 1, "crash": False, "slots": 2},
    ])
    res = tune(fake)
    profile = Profile.load(res.profile_path)
    out = report("fake", None, html_path=tmp_path / "r.html")
    rec = out["recommendation"]
    assert rec["trial"] == profile.study.trial
    f = rec["figure"]
    obj = profile.metrics["objective"]
    # (two fresh runs a side, apart: the report adds how often chance does that)
    assert obj["basis"] == "median of the confirmation runs"
    assert f["basis"] == obj["basis"] or (
        f["basis"].startswith(obj["basis"] + "; 2 and 2 fresh runs") and "1 time in 6" in
        f["basis"])
    if not rec["kept_defaults"]:
        assert f["ratio"] == pytest.approx(obj["improvement"])
        assert f["interval"] is not None and f["interval"][0] <= f["ratio"] <= f["interval"][1]
    assert f["unit"] == "ms" and rec["emit_command"].startswith("qtune emit profiles/fake")
    assert rec["measured_on"]["workload"].startswith("2 concurrent streams")
    # strict JSON, and the page states the same answer first
    from qtune.jsonout import dumps

    json.loads(dumps(out), parse_constant=lambda c: pytest.fail(c))
    page = (tmp_path / "r.html").read_text()
    assert page.index("Recommendation") < page.index("<h2>Trials")
    assert "startup_failed" in page or "oom" in page




def test_report_names_the_profile_the_search_wrote_with_out(fake, monkeypatch, tmp_path):
    """With --out the deploy command names that file, not profiles/<study>.yaml
    (GPU run 20: --out /tmp/qt/h200-tf.yaml, and the report said
    profiles/h200-tf.yaml, a file that did not exist)."""
    import shlex

    from qtune.report import report

    script_random_sampler(monkeypatch, [{"delay_ms": 1, "crash": False, "slots": 4}])
    out = tmp_path / "elsewhere it's.yaml"  # a name the shell must have quoted
    res = tune(dataclasses.replace(fake, trials=1, out=out,
                                   confirm=Confirmation(top=0, repeats=0)))
    assert res.profile_path == out.absolute() and out.is_file()
    rec = report("fake", None)["recommendation"]
    cmd = rec["emit_command"]
    assert cmd.startswith(f"qtune emit {shlex.quote(str(out.absolute()))} --format systemd")
    words = shlex.split(cmd)
    assert words[2] == str(out.absolute())
    # it runs as pasted: with the flags this host's paths need (here the
    # fake's python links under /root: --user), why on a line of its own
    r = subprocess.run([sys.executable, "-m", "qtune", *words[1:], "-o",
                        str(tmp_path / "u.service")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    flags = words[5:]
    for flag in ("--allow-tmp", "--user"):
        assert (flag in flags) == (flag in (rec["emit_why"] or "")), (flags, rec["emit_why"])
    # and the bare command is refused exactly when flags were added
    bare = subprocess.run([sys.executable, "-m", "qtune", *words[1:5], "-o",
                           str(tmp_path / "v.service")], capture_output=True, text=True,
                          timeout=60)
    assert (bare.returncode != 0) == bool(flags), bare.stderr
