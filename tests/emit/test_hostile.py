"""Hostile profiles through ``qtune emit``, as issue 14 reproduced them.

Each refused case asserts: exit code 1, one ``error:`` line naming the field
and one ``hint:`` line, no traceback, nothing written at ``-o`` (nor anywhere
else), and the refused value (a secret, or an injected line) in no output.
Cases that are not refused must come back exactly through the format's own
reader (tests/emit/readback.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from qtune import cli, console
from qtune.profile import Profile
from tests.emit.test_properties import check_compose, check_kubernetes, check_systemd
from tests.fakes.profile import sample_profile

ROOT = Path(__file__).parents[2]
PWN = "ExecStartPre=/bin/touch /tmp/pwned"
POD = ("n\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  hostPID: true\n"
       "  containers: [{name: x, image: busybox, securityContext: {privileged: true}}]")
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def at(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set ``a.b.c`` (list items by index) in the profile data."""
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d.setdefault(p, {})
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return mutate


def argv_plus(*words: str) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d["argv"] = [*d["argv"], *words]
    return mutate


def env(**kv: str) -> Callable[[dict[str, Any]], None]:
    return at("env", {"HF_HUB_OFFLINE": "1", **kv})


def env_key(key: str) -> Callable[[dict[str, Any]], None]:
    return at("env", {"HF_HUB_OFFLINE": "1", key: "1"})


def on(engine: str, path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """``at`` on a profile of ``engine``: its own rank counts are checked."""
    def mutate(d: dict[str, Any]) -> None:
        d["engine"]["name"] = engine
        at(path, value)(d)
    return mutate


def placed(**kw: Any) -> Callable[[dict[str, Any]], None]:
    return at("placement", {"numa_node": 0, "cpus": "0-1", "why": "test"} | kw)


# (id, format, change, words the error names, a value no output may carry)
REFUSED: list[tuple[str, str, Callable[[dict[str, Any]], None], str, str | None]] = [
    # Injection into emitted files
    ("cpus-newline", "systemd", placed(cpus="0-1\n" + PWN), "placement.cpus", PWN),
    ("why-newline", "systemd", placed(why="x\n" + PWN), "placement.why", PWN),
    ("name-newline", "systemd", at("name", "n\n[Service]\n" + PWN), "name", PWN),
    ("objective-section", "systemd",
     at("metrics.objective.name", "e2e_p99\n[Service]\n" + PWN), "metrics.objective.name",
     PWN),
    ("model-id-newline", "systemd", at("model.id", "m\n" + PWN), "model.id", PWN),
    ("engine-version-newline", "systemd", at("engine.version", "0.32.0\n" + PWN),
     "engine.version", PWN),
    ("notes-privileged-pod", "kubernetes", at("notes", [POD]), "notes.0", "privileged"),
    ("notes-compose-include", "compose", at("notes", ["n\ninclude:\n  - evil.yaml"]),
     "notes.0", "evil.yaml"),
    ("notes-line-separator", "compose", at("notes", ["n\u2028include: [evil.yaml]"]),
     "notes.0", "evil.yaml"),
    ("notes-nel", "kubernetes", at("notes", ["n\x85---"]), "notes.0", None),
    ("notes-cr", "systemd", at("notes", ["n\r" + PWN]), "notes.0", PWN),
    ("notes-bidi", "compose", at("notes", ["a\u202eb"]), "notes.0", None),
    ("notes-escape-sequence", "systemd", at("notes", ["\x1b]0;title\x07"]), "notes.0",
     "title"),
    ("host-key-newline", "systemd", at("host", {"a\n[Service]": 1}), "host.(a key)",
     "[Service]"),
    ("env-key-equals", "compose", env_key("A=B"), "env.(a key)", None),
    ("env-key-space", "kubernetes", env_key("A B"), "env.(a key)", None),
    ("env-key-empty", "compose", env_key(""), "env.(a key)", None),
    ("env-key-digit", "systemd", env_key("1A"), "env.(a key)", None),
    ("argv0-relative", "systemd", at("argv.0", "python"), "argv.0", None),
    ("argv0-dollar", "systemd", at("argv.0", "/opt/$X/python"), "argv.0", None),
    ("name-path", "compose", at("name", "../../x"), "name", None),
    # Secrets
    ("argv-api-key", "systemd", argv_plus("--api-key", "S3cretValue42"), "argv.10",
     "S3cretValue42"),
    ("argv-api-key-equals", "compose", argv_plus("--api-key=S3cretValue42"), "argv.9",
     "S3cretValue42"),
    ("argv-hf-token", "kubernetes", argv_plus("--hf-token", "S3cretValue42"), "argv.10",
     "S3cretValue42"),
    ("argv-db-password", "systemd", argv_plus("--db-password", "S3cretValue42"), "argv.10",
     "S3cretValue42"),
    ("argv-client-secret", "compose", argv_plus("--client-secret=S3cretValue42"),
     "argv.9", "S3cretValue42"),
    ("argv-url-password", "kubernetes", argv_plus("--x", "https://u:S3cretValue42@h/"),
     "argv.10", "S3cretValue42"),
    ("env-gh-pat", "compose", env(GH_PAT=GHP), "env.GH_PAT", GHP),
    ("env-ghp-value", "systemd", env(X=GHP), "env.X", GHP),
    ("env-short-hf", "kubernetes", env(X="hf_abc"), "env.X", "hf_abc"),
    ("env-hf-6", "systemd", env(X="hf_abcdef"), "env.X", "hf_abcdef"),
    ("env-github-pat", "compose", env(X="github_pat_11ABCDEFG0123456789_abcdefghij"),
     "env.X", "github_pat_11ABCDEFG"),
    ("env-openai", "kubernetes", env(X="sk-proj-abcdefghij0123456789"), "env.X",
     "sk-proj-abcdefghij"),
    ("env-slack", "systemd", env(X="xoxb-1234567890-abcdefghij"), "env.X",
     "xoxb-1234567890"),
    ("env-aws", "compose", env(X="AKIAIOSFODNN7EXAMPLE"), "env.X", "AKIAIOSFODNN7EXAMPLE"),
    ("env-token-name", "kubernetes", env(MY_TOKEN="x"), "env.MY_TOKEN", None),
    ("env-secret-with-newline", "systemd", env(X="S3cretValue42\n"), "env.X",
     "S3cretValue42"),
    ("argv-secret-with-newline", "systemd", argv_plus("--api-key", "S3cretValue42\n"),
     "argv.10", "S3cretValue42"),
    ("notes-token", "kubernetes", at("notes", ["token hf_abcdefghijklmnop"]), "notes.0",
     "hf_abcdefghijklmnop"),
    ("storage-password", "systemd",
     at("study.storage", "postgresql://u:S3cretValue42@db/qtune"), "study.storage",
     "S3cretValue42"),
    # Types: strict, no internal errors
    ("best-fast", "systemd", at("metrics.objective.best", "fast"),
     "metrics.objective.best", None),
    ("startup-nan", "kubernetes", at("metrics.startup_s", float("nan")),
     "metrics.startup_s", None),
    ("startup-string", "compose", at("metrics.startup_s", "40"), "metrics.startup_s", None),
    ("numa-negative", "systemd", placed(numa_node=-1), "placement.numa_node", None),
    ("numa-string", "systemd", placed(numa_node="0"), "placement.numa_node", None),
    ("cpus-shell", "compose", placed(cpus="0-3;rm -rf /"), "placement.cpus", None),
    ("cpus-missing", "systemd", placed(cpus=None), "placement.cpus", None),
    ("tp-fast", "kubernetes", at("params.tensor_parallel_size", "fast"),
     "params.tensor_parallel_size", None),
    # every engine's rank counts, not only vLLM's (the emitters multiply them)
    ("sglang-tp-fast", "compose", on("sglang", "params.tp_size", "fast"),
     "params.tp_size", None),
    ("tgi-shards-zero", "kubernetes", on("tgi", "params.num_shard", 0),
     "params.num_shard", None),
    # strict, as every profile field: a text or a flag is no count
    ("tp-text", "compose", at("params.tensor_parallel_size", "2"),
     "params.tensor_parallel_size", None),
    ("tgi-shards-bool", "systemd", on("tgi", "params.num_shard", True),
     "params.num_shard", None),
    ("model-id-number", "systemd", at("model.id", 5), "model.id", None),
    ("engine-version-dollar", "compose", at("engine.version", "0.32.0$X"),
     "engine.version", None),
    ("objective-space", "systemd", at("metrics.objective.name", "e2e p99"),
     "metrics.objective.name", None),
    ("study-trial-bool", "systemd", at("study.trial", True), "study.trial", None),
]


def run_emit(args: list[str], monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``qtune emit`` through cli.main, as the console script runs it."""
    monkeypatch.setattr(sys, "argv", ["qtune", "emit", *args])
    monkeypatch.setattr("qtune.server.install_signal_handlers", lambda: None)
    monkeypatch.setattr(console.err, "_width", 1000)  # one line, however long
    with pytest.raises(SystemExit) as e:
        cli.main()
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def write_profile(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = sample_profile().model_dump(mode="json")
    change(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def assert_refused(rc: int, out: str, err: str, needle: str, secret: str | None) -> None:
    assert rc == 1, err
    assert "Traceback" not in out + err and "internal error" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith("error: profile ") and f": {needle}: " in lines[0], err
    assert lines[1].startswith("hint: "), err
    if secret:
        assert secret not in out + err


@pytest.mark.parametrize(("fmt", "change", "needle", "secret"),
                         [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_hostile_profile_is_refused(tmp_path, monkeypatch, capsys, fmt, change, needle,
                                   secret):
    path = write_profile(tmp_path, change)
    (tmp_path / "out").mkdir()  # (-o makes no folder: issue 28)
    target = tmp_path / "out" / "unit"
    rc, out, err = run_emit([str(path), "--format", fmt, "-o", str(target)],
                            monkeypatch, capsys)
    assert_refused(rc, out, err, needle, secret)
    assert sorted(os.listdir(tmp_path)) == ["out", "p.yaml"]  # nothing written
    assert os.listdir(tmp_path / "out") == []


def test_created_as_a_yaml_date_is_refused(tmp_path, monkeypatch, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(sample_profile().dump().replace(
        "created: '2026-11-29T00:00:00+00:00'", "created: 2026-11-29"))
    rc, out, err = run_emit([str(path)], monkeypatch, capsys)
    assert_refused(rc, out, err, "created", None)


def test_port_that_is_not_a_number_is_refused_by_the_container_formats(
        tmp_path, monkeypatch, capsys):
    base = sample_profile().argv
    path = write_profile(tmp_path, at("argv", [*base[:5], "--port", "80x",
                                               "--max-num-seqs", "8"]))
    for fmt in ("compose", "kubernetes"):
        rc, out, err = run_emit([str(path), "--format", fmt, "-o", str(tmp_path / "o")],
                                monkeypatch, capsys)
        assert rc == 1 and "Traceback" not in err and "--port" in err, err
        assert [ln[:5] for ln in err.splitlines() if ln.strip()] == ["error", "hint:"]
        assert not (tmp_path / "o").exists()


# Not refused: written so that the format's own reader gives back exactly
# the profile's argv and env.
SAFE: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("k8s-double-dollar", "kubernetes", argv_plus("--x", "a$$(HF_TOKEN)b")),
    ("k8s-var-ref", "kubernetes", argv_plus("--x", "$(HF_TOKEN)", "$", "a$")),
    ("k8s-env-var-ref", "kubernetes", env(A="$(HF_TOKEN)", B="$$(X)")),
    ("compose-braced", "compose", argv_plus("--x", "${HF_TOKEN}", "$$HOME")),
    ("compose-env-ref", "compose", env(A="${HF_TOKEN:-x}", B="$")),
    ("systemd-specifiers", "systemd", argv_plus("--x", "%n", "%%", "$HOME", "${X}")),
    ("systemd-semicolon", "systemd", argv_plus(";", "\\;", "a;b")),
    ("systemd-quotes", "systemd", argv_plus("'a'", '"b"', "c\\", "")),
    ("systemd-why-backslash", "systemd", placed(why="ends in a backslash \\")),
    ("systemd-model-id-percent", "systemd", at("model.id", "org/m%n\\")),
    ("yaml-notes-syntax", "kubernetes", at("notes", ["--- a: b # c", "... &x *x !!str"])),
    ("yaml-argv-syntax", "compose", argv_plus("---", "- a", "k: v", "#c", "&a", "*a")),
]


@pytest.mark.parametrize(("fmt", "change"), [c[1:] for c in SAFE],
                         ids=[c[0] for c in SAFE])
def test_awkward_profile_is_emitted_exactly(tmp_path, monkeypatch, capsys, fmt, change):
    path = write_profile(tmp_path, change)
    target = tmp_path / "out"
    rc, out, err = run_emit([str(path), "--format", fmt, "-o", str(target)],
                            monkeypatch, capsys)
    assert rc == 0, err
    check = {"systemd": check_systemd, "compose": check_compose,
             "kubernetes": check_kubernetes}[fmt]
    check(Profile.load(path), target.read_text())


def test_the_console_script_refuses_a_secret_without_printing_it(tmp_path):
    """The same through a real process (python -m qtune): exit code, two
    lines, no traceback, the value nowhere."""
    path = write_profile(tmp_path, argv_plus("--api-key", "S3cretValue42"))
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    r = subprocess.run([sys.executable, "-m", "qtune", "emit", str(path), "-o",
                        str(tmp_path / "u.service")], capture_output=True, text=True,
                       env=env_vars, cwd=tmp_path, timeout=120)
    assert_refused(r.returncode, r.stdout, r.stderr, "argv.10", "S3cretValue42")
    assert sorted(os.listdir(tmp_path)) == ["p.yaml"]
