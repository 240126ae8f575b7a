"""The CLI as a user runs it: exit codes, one-line errors, nothing written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.profile import sample_profile

ROOT = Path(__file__).parent.parent


def qtune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "qtune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_clean_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: "), r.stderr
    assert needle in r.stderr, r.stderr
    assert any(ln.startswith("hint: ") for ln in lines), r.stderr


@pytest.mark.engine
@pytest.mark.parametrize(
    ("args", "files", "needle"),
    [
        (["--slo", "ttft_p99 < fast"], {}, "--slo"),
        (["--space", "s.yaml"], {"s.yaml": "max_num_seqs: [1, 2\n"}, "not valid YAML"),
        (["--space", "s.yaml"], {"s.yaml": "max_num_seq: 8\n"}, "max_num_seqs"),
        (["--model", "./nope"], {}, "nope"),
        (["--model", "empty"], {"empty/readme": "x"}, "config.json"),
        (["--model", "org/not-cached-model"], {}, "cache"),
        (["--objective", "p99"], {}, "objective"),
        (["--engine", "tgl"], {}, "vllm"),
        (["--storage", "studies.db"], {}, "URL"),
        (["--input-len", "4000", "--output-len", "200"], {}, "context"),
        (["--rate", "2", "--concurrency", "2"], {}, "exclusive"),
        (["--sampler", "cmaes"], {}, "sampler"),
        (["--workload", "w.yaml"], {"w.yaml": "rate: [1\n"}, "YAML"),
        (["--objective", "capacity"], {}, "--slo"),
        (["--levels", "2,4"], {}, "--objective pareto"),
        (["--objective", "pareto", "--levels", "4"], {}, "--levels"),
    ],
)
def test_search_bad_input(tmp_path, args, files, needle):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    before = set(os.listdir(tmp_path))
    r = qtune("search", *args, cwd=tmp_path)
    assert_clean_error(r, needle)
    assert set(os.listdir(tmp_path)) == before  # no studies/ or profiles/ left


def test_debug_shows_traceback(tmp_path):
    r = qtune("--debug", "search", "--slo", "x", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_emit_invalid_profile_writes_nothing(tmp_path):
    (tmp_path / "p.yaml").write_text("name: x\nengine: 3\n")
    r = qtune("emit", "p.yaml", "--format", "systemd", "-o", "u.service", cwd=tmp_path)
    assert_clean_error(r, "p.yaml")
    assert not (tmp_path / "u.service").exists()


def test_emit_writes_and_prints_json(tmp_path):
    sample_profile().save(tmp_path / "p.yaml")
    r = qtune("emit", "p.yaml", "--format", "systemd", "-o", "u.service", "--json",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["format"] == "systemd"
    assert (tmp_path / "u.service").read_text() == d["text"]
    r = qtune("emit", "p.yaml", "--format", "docker", cwd=tmp_path)
    assert_clean_error(r, "docker")
    r = qtune("emit", "p.yaml", "--format", "systemd", "--image", "a/b:1", "-o", "v.service",
              cwd=tmp_path)
    assert_clean_error(r, "--image")
    assert not (tmp_path / "v.service").exists()
    r = qtune("emit", "p.yaml", "-f", "kubernetes", "--image", "a/b:1", "-o", "k.yml",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "image: a/b:1" in (tmp_path / "k.yml").read_text()


def test_usage_error_exit_code(tmp_path):
    r = qtune("search", "--no-such-flag", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_probe_json(tmp_path):
    r = qtune("probe", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert isinstance(d["cpu"]["physical_cores"], int)
    assert isinstance(d["numa"]["nodes"], list) and d["numa"]["nodes"]
    for key in ("memory", "thp", "gpus", "engines", "findings"):
        assert key in d


# -- options declared once, defaults and choices from the library ------------

WORKLOAD_OPTIONS = ("rate", "concurrency", "input_len", "output_len", "requests",
                    "duration", "warmup", "seed", "arrival", "burstiness", "dataset",
                    "prefix_count", "prefix_len", "endpoint", "request_timeout",
                    "stall_timeout", "workload")


def _help(*command: str) -> str:
    from typer.testing import CliRunner

    from qtune.cli import app

    r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    # One line of text: no box, a wrapped help text joined up again.
    return " ".join(r.output.replace("│", " ").split())


def test_help_lists_the_registries_and_workload_defaults():
    from qtune.emit import CONTAINER_EMITTERS, EMITTERS
    from qtune.engines import ENGINES
    from qtune.load.workload import DEFAULT_CONCURRENCY, Workload
    from qtune.objectives import OBJECTIVES
    from qtune.search.space import SAMPLERS

    search, bench = _help("search"), _help("bench")
    assert "{" not in search + bench
    for name in [*SAMPLERS, *OBJECTIVES, *ENGINES]:
        assert name in search
    for name in [*EMITTERS, *CONTAINER_EMITTERS]:
        assert name in _help("emit")
    wl = Workload()
    for text in (search, bench):
        assert f"Warm-up requests, not counted (default: {wl.warmup_requests})" in text
        assert f"(default: {DEFAULT_CONCURRENCY} without --rate)" in text
        assert f"(default: {wl.input_len})" in text and f"(default: {wl.requests} " in text
        assert f"(default: {wl.stall_timeout:g})" in text


def _defaults(command: str) -> dict[str, object]:
    import typer

    from qtune.cli import app

    group = typer.main.get_command(app)
    return {p.name: p.default for p in group.commands[command].params}  # type: ignore[attr-defined]


def test_command_defaults_are_the_librarys():
    """An option named as a config field defaults to that field's default, so
    the CLI and the library cannot drift apart."""
    import dataclasses

    from qtune.bench import BenchConfig
    from qtune.search.config import TuneConfig

    # Not compared: the workload options (None: Workload's default, see below)
    # and --levels, a text that parse_levels reads.  The option groups'
    # options take their defaults from their fields (qtune.options).
    skip = {*WORKLOAD_OPTIONS, "levels"}
    for command, cls in (("search", TuneConfig), ("bench", BenchConfig)):
        fields = {f.name: f.default for f in dataclasses.fields(cls)
                  if f.default is not dataclasses.MISSING and f.name not in skip}
        shared = {k: v for k, v in _defaults(command).items() if k in fields}
        assert len(shared) >= 3, shared
        assert shared == {k: fields[k] for k in shared}, command


def test_workload_options_declared_once():
    search, bench = _defaults("search"), _defaults("bench")
    for name in WORKLOAD_OPTIONS:
        assert search[name] is None and bench[name] is None, name  # "not given"
    assert "load" not in search and "load" not in bench


def test_load_options_file_then_flags_then_workload_defaults(tmp_path):
    from qtune.cli_options import LoadOptions
    from qtune.load.workload import Workload

    assert LoadOptions().workload() == Workload()
    # The load the README and --help describe, now the library's own default.
    d = Workload()
    assert (d.concurrency, d.requests, d.warmup_requests) == (4, 200, 16)
    f = tmp_path / "w.yaml"
    f.write_text("rate: 2\ninput_len: 32\nwarmup_requests: null\n")
    wl = LoadOptions({"workload": f, "input_len": "16", "seed": None}).workload()
    assert (wl.rate, wl.input_len, wl.seed) == (2, "16", Workload().seed)
    assert wl.concurrency is None and wl.warmup_requests == Workload().warmup_requests


def test_the_cli_loads_no_engine_search_or_client_to_start(tmp_path):
    """The help's registry names are filled in only when help is shown."""
    code = ("import sys, typer, qtune.cli as c; typer.main.get_command(c.app); "
            "print(sorted({'optuna', 'aiohttp', 'numpy', 'pydantic'} & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


# -- output a script can trust: one strict JSON object, distinct exit codes ---

def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_check_json_against_a_server_that_is_down(tmp_path):
    from qtune.server import free_port

    p = tmp_path / "p.yaml"
    p.write_text(sample_profile().dump())
    r = qtune("check", str(p), "--url", f"http://127.0.0.1:{free_port()}", "--json",
              cwd=tmp_path)
    assert r.returncode == 6, r.stderr  # unreachable: not 1 (bad input), not 4/5
    doc = _strict(r.stdout)  # exactly one object: json.loads refuses trailing text
    assert doc["exit_code"] == 6 and doc["kind"] == "unreachable"
    assert "no answer" in doc["error"] and doc["hint"]


def test_json_errors_for_bad_input_and_usage(tmp_path):
    r = qtune("check", str(tmp_path / "missing.yaml"), "--url", "http://127.0.0.1:1",
              "--json", cwd=tmp_path)
    doc = _strict(r.stdout)
    assert r.returncode == 1 == doc["exit_code"] and doc["error"] and "hint" in doc
    r = qtune("report", "s", "--json", "--bogus", cwd=tmp_path)
    doc = _strict(r.stdout)
    assert r.returncode == 2 == doc["exit_code"] and doc["kind"] == "usage"
    assert "--help" in doc["hint"]


def test_one_json_writer_writes_no_nan():
    import math

    import numpy as np

    from qtune.jsonout import dumps

    doc = _strict(dumps({"a": math.nan, "b": [math.inf, -math.inf, 1.5],
                         "c": np.float64("nan"), "d": np.int64(3), "e": (1, 2),
                         "f": Path("/x")}))
    assert doc == {"a": None, "b": [None, None, 1.5], "c": None, "d": 3, "e": [1, 2],
                   "f": "/x"}


# -- help for people -----------------------------------------------------------

def _help80(*command: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "qtune", *command], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_search_help_at_80_columns_is_grouped_and_uncut():
    text = _help80("search", "-h")  # -h as well as --help
    head = text.splitlines()[:60]
    assert not [ln for ln in head if "…" in ln]
    for panel in ("Engine", "Workload", "Search", "Confirmation", "Quality", "Fleet",
                  "Output"):
        assert f"─ {panel} ─" in text
    # the panels come in one order
    assert text.index("─ Workload ─") < text.index("─ Search ─") < text.index("─ Output ─")
    assert "<bool>" not in text and "[default" not in text
    assert "--max-quality-loss" in text and "--allow-mixed-hosts" in text
    assert not [ln for ln in text.splitlines() if "…" in ln]


def test_every_command_help_has_no_bool_metavar_and_one_default_style():
    for command in ("probe", "bench", "verify", "check", "report", "emit", "dashboard",
                    "storage-proxy", None):
        text = _help80(*([command] if command else []), "-h")
        assert "<bool>" not in text and "[default" not in text, command
        assert "…" not in text, command


def test_out_is_one_spelling_with_the_old_one_kept(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(sample_profile().dump())
    assert re.search(r"--out +-o ", _help80("search", "-h"))
    emit_help = _help80("emit", "-h")
    assert "--out" in emit_help and "--output " not in emit_help  # hidden alias
    for flag in ("-o", "--out", "--output"):
        target = tmp_path / f"unit{flag}.service"
        r = qtune("emit", str(p), flag, str(target), cwd=tmp_path)
        assert r.returncode == 0 and target.is_file(), (flag, r.stderr)


def test_a_flag_takes_no_value(tmp_path):
    r = qtune("probe", "--json", "true", cwd=tmp_path)
    assert r.returncode == 2  # "true" is not an argument of probe
