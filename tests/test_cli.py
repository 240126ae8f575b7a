"""The CLI as a user runs it: exit codes, one-line errors, nothing written."""

from __future__ import annotations

import json
import os
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
