"""Issue 28's reproductions, one test per bullet of its High, Medium and
Lower lists: each failed on d664cbb and passes now."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from qtune.errors import redact
from tests.fakes.profile import sample_profile
from tests.security import hostile_server as hs
from tests.security.harness import SECRET, check_outcome, run_cli

pytestmark = pytest.mark.usefixtures("_in_tmp")


@pytest.fixture
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _profile(path: Path, **over: Any) -> Path:
    d = sample_profile().model_dump(mode="json")
    d.update(over)
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def _journal(path: Path) -> Path:
    from optuna.storages.journal import JournalFileBackend

    path.parent.mkdir(exist_ok=True)
    st = optuna.create_study(study_name="s", storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(path))))
    st.set_user_attr("objective", "e2e_p99")
    st.add_trial(optuna.trial.create_trial(
        params={}, distributions={}, value=1.0,
        user_attrs={"detail": "evil[/] \x1b[31m", "status": "crash", "reason": "crash"}))
    return path


# -- High ---------------------------------------------------------------------
def test_outputs_never_overwrite_inputs(tmp_path, monkeypatch, capsys):
    p = _profile(tmp_path / "p.yaml")
    before = p.read_bytes()
    rc, out, err, took = run_cli(["emit", "p.yaml", "--format", "systemd", "-o", "p.yaml"],
                                 monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert "input" in err and p.read_bytes() == before
    os.link(p, tmp_path / "hard.yaml")
    rc, out, err, took = run_cli(["emit", "p.yaml", "-o", "hard.yaml"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert p.read_bytes() == before
    journal = _journal(tmp_path / "studies" / "s.log")
    jbefore = journal.read_bytes()
    rc, out, err, took = run_cli(["search", "--study", "s", "--pick", "0", "--out",
                                  "studies/s.log"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert "is an input" in err and journal.read_bytes() == jbefore


def test_capture_never_writes_through_a_link_inside(tmp_path, monkeypatch, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("ORIGINAL\n")
    victim.chmod(0o444)
    (tmp_path / "cap").mkdir()
    os.symlink("../victim.txt", tmp_path / "cap" / "nvml.json")
    rc, out, err, took = run_cli(["probe", "--capture", "cap", "--json"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0, 1))
    assert victim.read_text() == "ORIGINAL\n"


def test_credentials_never_follow_a_redirect(monkeypatch, capsys):
    with hs.Server({"/v1/models": hs.models("m")}) as other, \
            hs.Server({"/v1/models": hs.redirect(other + "/v1/models")}) as url:
        creds = url.replace("http://", f"http://alice:{SECRET}@")
        rc, out, err, took = run_cli(["bench", "--url", creds, "--requests", "1"],
                                     monkeypatch, capsys)
        seen = hs.SERVERS[other].seen
    check_outcome(rc, out, err, took, (1,))
    assert "302" in err
    assert not any("authorization" in {k.lower() for k in h} for _, _, h in seen)


@pytest.mark.parametrize("extra", [["--api-ke", SECRET], [f"--api-k={SECRET}"],
                                   ["--po", "9000"]])
def test_abbreviated_engine_flags_are_refused(tmp_path, monkeypatch, capsys, extra):
    d = sample_profile().model_dump(mode="json")
    _profile(tmp_path / "p.yaml", argv=[*d["argv"], *extra])
    for fmt in ("systemd", "compose"):
        rc, out, err, took = run_cli(["emit", "p.yaml", "-f", fmt], monkeypatch, capsys)
        check_outcome(rc, out, err, took, (1,))
        assert "abbreviates" in err


# -- Medium -------------------------------------------------------------------
def test_secrets_are_masked_by_shape(tmp_path, monkeypatch, capsys):
    weird = f"p@ss/w#rd?{SECRET}"
    # bench and check: no server there, exit 6 (unreachable); the rest: bad input
    for args, rcs in ((["bench", "--url", f"http://u:{weird}@127.0.0.1:1"], (6,)),
                      (["check", str(_profile(tmp_path / "p.yaml")), "--url",
                        f"http://u:{weird}@127.0.0.1:1"], (6,)),
                      (["storage-proxy", "--storage",
                        f"postgresql://u@127.0.0.1:1/db?password={SECRET}"], (1,)),
                      (["report", "s", "--storage",
                        f"postgresql://u@127.0.0.1:1/db?password={SECRET}"], (1,)),
                      (["emit", "p.yaml", "-f", "kubernetes", "--autoscale", "keda",
                        "--prometheus-url", f"http://u:{weird}@p:9090"], (1,))):
        rc, out, err, took = run_cli(args, monkeypatch, capsys)
        check_outcome(rc, out, err, took, rcs)
    # secret-looking query parameters never reach a manifest
    d = sample_profile().model_dump(mode="json")
    d["metrics"]["objective"]["name"] = "capacity"  # (a rate to scale on)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    for query in (f"?token={SECRET}", f"?access_token={SECRET}", f"?x=1&api_key={SECRET}"):
        rc, out, err, took = run_cli(["emit", "c.yaml", "-f", "kubernetes", "--autoscale",
                                      "keda", "--prometheus-url", f"http://p:9090/{query}"],
                                     monkeypatch, capsys)
        check_outcome(rc, out, err, took, (1,))
    rc, out, err, took = run_cli(["emit", "c.yaml", "-f", "kubernetes", "--autoscale",
                                  "keda", "--prometheus-url", "http://p:9090/"],
                                 monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0,))
    # a profile's study.storage holding a libpq password is refused
    _profile(tmp_path / "q.yaml", study={"storage": f"postgresql://u@h/d?password={SECRET}",
                                         "name": "s", "trial": 1, "trials_run": 3})
    rc, out, err, took = run_cli(["emit", "q.yaml"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    # --json carries a server's error text masked, as the human output does
    with hs.Server({"/v1/models": hs.models("m"), "/v1/completions": hs.sse(
            {"error": {"message": f"bad key sk-{'q' * 24} password={SECRET}"}})}) as url:
        rc, out, err, took = run_cli(["bench", "--url", url, "--requests", "1", "--json",
                                      "--no-server-metrics"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (3,))
    assert "password=***" in out


def test_unbounded_work_is_bounded(tmp_path, monkeypatch, capsys):
    # redact() is linear: a 64 KB value in milliseconds (it took 8.5 s)
    for text in ("a" * 65536, "key" * 21846, "://a:" * 13107, "a@" * 32768):
        t0 = time.perf_counter()
        redact(text)
        assert time.perf_counter() - t0 < 0.5
    # YAML aliases are refused, not expanded
    bomb = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8))
    (tmp_path / "p.yaml").write_text(bomb)
    rc, out, err, took = run_cli(["emit", "p.yaml"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert "alias" in err and took < 5
    # a server dripping /v1/models cannot hold bench past its deadline
    monkeypatch.setattr("qtune.load.http.DEADLINE_S", 2.0, raising=False)
    with hs.Server({"/v1/models": hs.drip(60)}) as url:
        rc, out, err, took = run_cli(["bench", "--url", url, "--requests", "1"],
                                     monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert took < 15
    # a huge body is refused at the cap, not read whole
    from qtune.load.http import RequestRefused, request_bytes

    with hs.Server({"/v1/models": hs.huge(300)}) as url:
        tracemalloc.start()
        with pytest.raises(RequestRefused):
            request_bytes(url + "/v1/models", timeout=30)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 64 << 20


def test_untrusted_text_is_never_markup(tmp_path, monkeypatch, capsys):
    for mid in ("evil[/]", "\x1b[31mred", "[bold]x[/bold]"):
        with hs.Server({"/v1/models": hs.models(mid),
                        "/v1/completions": hs.sse(*hs.text_events())}) as url:
            rc, out, err, took = run_cli(["bench", "--url", url, "--requests", "2",
                                          "--no-server-metrics"], monkeypatch, capsys)
        check_outcome(rc, out, err, took, (0,))
    # check: a served model that differs is "not the tuned config" (5), not a crash
    _profile(tmp_path / "p.yaml")
    with hs.Server({"/v1/models": hs.models("evil[/]"),
                    "/v1/completions": hs.sse(*hs.text_events())}) as url:
        rc, out, err, took = run_cli(["check", "p.yaml", "--url", url, "--requests", "2"],
                                     monkeypatch, capsys)
    check_outcome(rc, out, err, took, (4, 5))
    # report: trial details are text
    _journal(tmp_path / "studies" / "s.log")
    rc, out, err, took = run_cli(["report", "s"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0,))


def test_read_only_commands_write_nothing(tmp_path, monkeypatch, capsys):
    rc, out, err, took = run_cli(["report", "s", "--storage",
                                  f"sqlite:///{tmp_path}/st#x.db"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert sorted(os.listdir(tmp_path)) == []
    journal = _journal(tmp_path / "studies" / "s.log")
    before = journal.read_bytes()
    run_cli(["search", "--study", "s", "--pick", "0"], monkeypatch, capsys)
    assert journal.read_bytes() == before
    # PostgreSQL: Optuna's tables are never created by a reader
    from qtune.search import storage

    seen: dict[str, Any] = {}

    class Fake:
        def __init__(self, url: str, **kw: Any) -> None:
            seen.update(kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Fake)
    st = storage.open_storage("postgresql://u@127.0.0.1:1/db", read_only=True)
    assert seen.get("skip_table_creation") is True
    with pytest.raises(Exception, match="read-only"):
        st.create_new_study([], "x")


# -- Lower --------------------------------------------------------------------
@pytest.mark.parametrize(("case", "over"), [
    ("unicode-cpus", {"placement": {"numa_node": 0, "cpus": "\u0660-\u0663"}}),
    ("startup-1e300", {"metrics": {"startup_s": 1e300}}),
])
def test_numbers_every_emitter_can_write(tmp_path, monkeypatch, capsys, case, over):
    _profile(tmp_path / "p.yaml", **over)
    for fmt in ("systemd", "kubernetes", "grafana"):
        rc, out, err, took = run_cli(["emit", "p.yaml", "-f", fmt], monkeypatch, capsys)
        check_outcome(rc, out, err, took, (1,))


def test_lower_internal_errors_are_input_errors(tmp_path, monkeypatch, capsys):
    text = yaml.safe_dump(sample_profile().model_dump(mode="json"), sort_keys=False)
    (tmp_path / "p.yaml").write_text(text.replace("max_num_seqs: 8", "max_num_seqs: "
                                                  + "9" * 5000))
    rc, out, err, took = run_cli(["emit", "p.yaml"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    _profile(tmp_path / "q.yaml")
    rc, out, err, took = run_cli(["emit", "q.yaml", "-o", "x" * 256], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    deep = ("[" * 5000 + "]" * 5000).encode()
    with hs.Server({"/v1/models": hs.raw(deep)}) as url:
        rc, out, err, took = run_cli(["bench", "--url", url], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    with hs.Server({"/v1/models": hs.models("m"),
                    "/v1/completions": hs.sse({"choices": {"a": 1}})}) as url:
        rc, out, err, took = run_cli(["bench", "--url", url, "--requests", "1",
                                      "--no-server-metrics"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (3,))


def test_duplicate_yaml_keys_are_refused(tmp_path, monkeypatch, capsys):
    text = yaml.safe_dump(sample_profile().model_dump(mode="json"), sort_keys=False)
    (tmp_path / "p.yaml").write_text(text + "name: other\n")
    rc, out, err, took = run_cli(["emit", "p.yaml"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (1,))
    assert "twice" in err


def test_csv_cells_are_never_formulas(tmp_path, monkeypatch, capsys):
    with hs.Server({"/v1/models": hs.models("m")}) as url:
        rc, out, err, took = run_cli(
            ["bench", "--url", url + "/=HYPERLINK(1)", "--url", url + "/@SUM(1)",
             "--requests", "1", "--no-server-metrics", "--csv", "out.csv"],
            monkeypatch, capsys)
    text = (tmp_path / "out.csv").read_text() if (tmp_path / "out.csv").exists() else ""
    for line in text.splitlines():
        for cell in line.split(","):
            assert not cell.startswith(("=", "+", "@")), line
    # report --csv: a trial's detail (a server's text) is a cell too
    from optuna.storages.journal import JournalFileBackend

    (tmp_path / "studies").mkdir()
    st = optuna.create_study(study_name="s", storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(tmp_path / "studies" / "s.log"))))
    st.add_trial(optuna.trial.create_trial(
        params={}, distributions={}, value=1.0,
        user_attrs={"detail": "=cmd|' /C calc'!A0", "status": "ok", "reason": "@SUM(1)"}))
    rc, out, err, took = run_cli(["report", "s", "--csv", "r.csv"], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0,))
    import csv as csvmod

    for row in csvmod.reader((tmp_path / "r.csv").read_text().splitlines()):
        for cell in row:
            assert not cell.startswith(("=", "+", "@")), row
    from qtune.files import csv_cell

    assert csv_cell("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0"
    assert csv_cell("-1.5") == "-1.5"


def test_output_paths_are_printed_visibly(tmp_path, monkeypatch, capsys):
    _profile(tmp_path / "p.yaml")
    rc, out, err, took = run_cli(["emit", "p.yaml", "-o", "a\nerror: forged"],
                                 monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0, 1))
    assert not any(line.startswith("error: forged") for line in err.splitlines())


def test_no_infinite_number_anywhere_in_a_profile(tmp_path, monkeypatch, capsys):
    d = sample_profile().model_dump(mode="json")
    d["metrics"]["best"] = {"request_throughput": float("inf")}
    d["metrics"]["objective"] = {"name": "e2e_p99", "direction": "minimize"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    for args in (["-f", "kubernetes", "--autoscale", "keda"], ["-f", "grafana"]):
        rc, out, err, took = run_cli(["emit", "p.yaml", *args], monkeypatch, capsys)
        check_outcome(rc, out, err, took, (1,))
        assert "finite" in err


@pytest.mark.parametrize("message", ["evil[/]", "\x1b[31mred\nerror: forged", "[bold]"])
def test_the_internal_error_path_cannot_fail(monkeypatch, capsys, message):
    from qtune import cli

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError(message + f" sk-{'q' * 24}")

    monkeypatch.setattr(cli, "app", boom)
    rc, out, err, took = run_cli(["probe"], monkeypatch, capsys)
    assert rc == 1 and err.startswith("internal error: RuntimeError: ")
    assert "\x1b" not in err and "sk-qqqq" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("error")]) == 0


@pytest.mark.parametrize("name", ["st#x.db", "st?x.db", "st%23x.db", "a b#c?d.db"])
def test_sqlite_read_only_whatever_the_path_holds(tmp_path, monkeypatch, capsys, name):
    db = tmp_path / name
    from urllib.parse import quote

    url = "sqlite:///" + quote(str(db), safe="/")  # the file, as SQLAlchemy reads a URL
    st = optuna.create_study(study_name="s", storage=url)
    st.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    del st
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    from qtune.search.storage import sqlite_ro_url

    rc, out, err, took = run_cli(["report", "s", "--storage", url], monkeypatch, capsys)
    check_outcome(rc, out, err, took, (0,))
    if "?" not in name:  # a raw '#' is how a user writes it (the case)
        rc, out, err, took = run_cli(["report", "s", "--storage", f"sqlite:///{db}"],
                                     monkeypatch, capsys)
        check_outcome(rc, out, err, took, (0,) if "%" not in name else (1,))
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # no new file, the database untouched
    assert "mode=ro" in sqlite_ro_url(db)
