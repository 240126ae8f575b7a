"""Hostile inputs through the real CLI (``python -m qtune``): every one is
refused with one error line and a hint, no traceback, nothing written in
the working folder, nothing launched, and no secret in any output.

"Nothing launched": ``--engine-python`` (and a profile's ``argv[0]``) is a
script that leaves a marker file when run, so even the engine probe, which
comes before any server start, counts.  Engine-side emit cases live with the
emitters' tests.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from tests.fakes.model import make_model
from tests.fakes.profile import sample_profile

ROOT = Path(__file__).parent.parent
SECRET = "hunter2secretpw"
SECRETS = (SECRET, "hf_abcdefgh", "ghp_" + "a" * 36)


class Env:
    """A working folder (snapshotted), and a marker that says whether the
    engine's Python was run."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.work = base / "work"
        self.work.mkdir()
        self.marker = base / "launched"
        self.engine = base / "engine-python"
        self.engine.write_text(f"#!/bin/sh\ntouch {self.marker}\nexit 1\n")
        self.engine.chmod(0o755)

    def file(self, name: str, text: str | bytes, mode: int | None = None) -> Path:
        p = self.work / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        if mode is not None:
            p.chmod(mode)
        return p

    def model(self, name: str = "m", **over: object) -> Path:
        return make_model(self.work / name, **over)

    def profile(self, name: str = "p.yaml", model: Path | None = None,
                **over: object) -> Path:
        """A profile whose engine Python is the marker script."""
        mpath = str(model) if model is not None else str(self.work / "gone")
        d = sample_profile().model_dump(mode="json")
        d["model"]["path"] = mpath
        d["argv"] = [str(self.engine), "-m", "vllm.entrypoints.openai.api_server",
                     "--model", mpath, "--port", "8000", "--max-num-seqs", "8"]
        for k, v in over.items():
            cur = d
            *head, last = k.split(".")
            for h in head:
                cur = cur[h]
            cur[last] = v
        p = self.work / name
        p.write_text(yaml.safe_dump(d))
        return p

    def study(self, name: str = "s", journal: bool = True) -> Path:
        """A finished one-trial study in studies/<name>.log."""
        from qtune.search import open_storage

        path = self.work / "studies" / f"{name}.log"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        st = optuna.create_study(study_name=name,
                                 storage=open_storage(f"journal://{path}"))
        st.set_user_attr("objective", "e2e_p99")
        t = st.ask()
        t.set_user_attr("baseline", True)
        t.set_user_attr("status", "ok")
        t.set_user_attr("summary", {"e2e_ms": {"p99": 100.0}, "failed": 0,
                                    "request_throughput": 1.0})
        t.set_constraint("failed_requests", 0.0)
        st.tell(t, 100.0)
        return path


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under ``root`` (not following links): type and mode,
    size, mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                             st.st_ino)
    return out


def run(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400",
         "QTUNE_CACHE": str(env.base / "cache")}
    return subprocess.run([sys.executable, "-m", "qtune", *args], cwd=env.work, env=e,
                          capture_output=True, text=True, timeout=120)


Case = Callable[[Env], list[str]]
CASES: dict[str, tuple[Case, str]] = {}


def case(needle: str) -> Callable[[Case], Case]:
    def deco(fn: Case) -> Case:
        CASES[fn.__name__] = (fn, needle)
        return fn
    return deco


def search(env: Env, *args: str) -> list[str]:
    return ["search", "--engine-python", str(env.engine), "--trials", "2", *args]


def bench(env: Env, *args: str) -> list[str]:
    return ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--requests", "2",
            *args]


# -- files overwritten --------------------------------------------------------
@case("character device")
def search_out_dev_null(env: Env) -> list[str]:
    return search(env, "--out", "/dev/null")


@case("a folder")
def search_out_folder(env: Env) -> list[str]:
    (env.work / "outdir").mkdir()
    return search(env, "--out", "outdir")


@case("FIFO")
def search_out_fifo(env: Env) -> list[str]:
    os.mkfifo(env.work / "fifo")
    return search(env, "--out", "fifo")


@case("socket")
def search_out_socket(env: Env) -> list[str]:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(env.work / "sock"))
    s.close()
    return search(env, "--out", "sock")


@case("symbolic link")
def search_out_symlink(env: Env) -> list[str]:
    env.file("real.yaml", "x: 1\n")
    (env.work / "link.yaml").symlink_to("real.yaml")
    return search(env, "--out", "link.yaml")


@case("read-only")
def search_out_readonly(env: Env) -> list[str]:
    env.file("ro.yaml", "x: 1\n", mode=0o444)
    return search(env, "--out", "ro.yaml")


@case("not a folder")
def search_out_under_file(env: Env) -> list[str]:
    env.file("plain", "x")
    return search(env, "--out", "plain/p.yaml")


@case("a folder")
def search_default_profile_is_folder(env: Env) -> list[str]:
    (env.work / "profiles" / "s.yaml").mkdir(parents=True)
    return search(env, "--study", "s")


@case("a folder")
def report_csv_folder(env: Env) -> list[str]:
    env.study()
    (env.work / "out").mkdir()
    return ["report", "s", "--csv", "out"]


@case("character device")
def report_html_dev_null(env: Env) -> list[str]:
    env.study()
    return ["report", "s", "--html", "/dev/null"]


@case("symbolic link")
def report_csv_symlink(env: Env) -> list[str]:
    env.study()
    env.file("t.csv", "a\n")
    (env.work / "l.csv").symlink_to("t.csv")
    return ["report", "s", "--csv", "l.csv"]


@case("read-only")
def report_csv_readonly(env: Env) -> list[str]:
    env.study()
    env.file("t.csv", "a\n", mode=0o444)
    return ["report", "s", "--csv", "t.csv"]


@case("FIFO")
def report_parquet_fifo(env: Env) -> list[str]:
    env.study()
    os.mkfifo(env.work / "p.parquet")
    return ["report", "s", "--parquet", "p.parquet"]


@case("a folder")
def bench_csv_folder(env: Env) -> list[str]:
    (env.work / "c").mkdir()
    return bench(env, "--csv", "c")


@case("read-only")
def bench_csv_readonly(env: Env) -> list[str]:
    env.file("b.csv", "x\n", mode=0o444)
    return bench(env, "--csv", "b.csv")


@case("symbolic link")
def bench_csv_symlink(env: Env) -> list[str]:
    (env.work / "b.csv").symlink_to("/etc/passwd")
    return bench(env, "--csv", "b.csv")


@case("not a folder")
def probe_capture_file(env: Env) -> list[str]:
    env.file("afile", "x")
    return ["probe", "--capture", "afile", "--engine-python", str(env.engine)]


@case("character device")
def probe_capture_dev_null(env: Env) -> list[str]:
    return ["probe", "--capture", "/dev/null", "--engine-python", str(env.engine)]


@case("symbolic link")
def probe_capture_symlink(env: Env) -> list[str]:
    (env.work / "cap").symlink_to(env.base)
    return ["probe", "--capture", "cap", "--engine-python", str(env.engine)]


# -- names and paths ----------------------------------------------------------
@pytest.fixture(params=["..", "../../x", "a/b", "/tmp/abs", ".hidden", "a..b", "",
                        "x" * 200, "a\nb", "a\x1b[31mb", "a b"])
def bad_name(request):
    return request.param


def test_search_refuses_study_name(tmp_path, bad_name):
    env = Env(tmp_path)
    check(env, search(env, "--study", bad_name), "not a study name")


def test_report_refuses_study_name(tmp_path, bad_name):
    env = Env(tmp_path)
    env.study()
    check(env, ["report", bad_name], "not a study name")


@case("does not exist")
def search_sqlite_missing_folder(env: Env) -> list[str]:
    return search(env, "--storage", f"sqlite:///{env.base}/nonexistent/dir/x.db")


@case("does not exist")
def search_journal_missing_folder(env: Env) -> list[str]:
    return search(env, "--storage", f"journal://{env.base}/nonexistent/x.log")


@case("no storage file")
def report_sqlite_missing(env: Env) -> list[str]:
    return ["report", "s", "--storage", f"sqlite:///{env.work}/x.db"]


@case("does not exist")
def report_sqlite_missing_folder(env: Env) -> list[str]:
    return ["report", "s", "--storage", f"sqlite:///{env.work}/new/dir/x.db"]


@case("no storage file")
def report_journal_missing(env: Env) -> list[str]:
    return ["report", "s", "--storage", f"journal://{env.work}/x.log"]


@case("no study")
def report_missing_study(env: Env) -> list[str]:
    return ["report", "nope"]


@case("not a URL")
def search_storage_not_url(env: Env) -> list[str]:
    return search(env, "--storage", f"u:{SECRET}@db/x")


@case("partial record")
def search_torn_journal(env: Env) -> list[str]:
    path = env.study()
    with open(path, "ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "x", "trial_id": 0, "para')
    return search(env, "--study", "s")


@case("partial record")
def search_torn_journal_bad_last_line(env: Env) -> list[str]:
    path = env.study()
    with open(path, "ab") as f:
        f.write(b'{"op_code": 4, "wor\n')
    return search(env, "--study", "s", "--pick", "0")


# -- launches nobody asked for ------------------------------------------------
@case("no storage file")
def search_pick_new_study(env: Env) -> list[str]:
    return search(env, "--study", "new", "--pick", "0")


@case("no study")
def search_pick_new_study_in_existing_storage(env: Env) -> list[str]:
    env.study("s")
    return search(env, "--study", "other", "--storage",
                  f"journal://{env.work}/studies/s.log", "--pick", "0")


@case("not a fully measured")
def search_pick_missing_trial(env: Env) -> list[str]:
    env.study("s")
    return search(env, "--study", "s", "--pick", "7")


@case("does not exist")
def verify_model_folder_gone(env: Env) -> list[str]:
    return ["verify", str(env.profile())]


@case("tokenizer folder")
def verify_tokenizer_folder_gone(env: Env) -> list[str]:
    m = env.model()
    p = env.profile(model=m)
    d = yaml.safe_load(p.read_text())
    d["argv"] += ["--tokenizer", str(env.work / "tok-gone")]
    p.write_text(yaml.safe_dump(d))
    return ["verify", str(p)]


@case("does not exist")
def verify_against_model_gone(env: Env) -> list[str]:
    m = env.model()
    return ["verify", str(env.profile(model=m)), "--against",
            str(env.profile("o.yaml"))]


# -- secrets ------------------------------------------------------------------
@case("cannot list models")
def bench_url_password_unreachable(env: Env) -> list[str]:
    return ["bench", "--url", f"http://user:{SECRET}@127.0.0.1:9", "--requests", "2"]


@case("bad port")
def bench_url_password_bad_port(env: Env) -> list[str]:
    return ["bench", "--url", f"http://user:{SECRET}@127.0.0.1:80x", "--model", "m"]


@case("cannot list models")
def bench_url_token_in_query(env: Env) -> list[str]:
    return ["bench", "--url", "http://127.0.0.1:9/?key=hf_abcdefgh", "--requests", "2"]


@case("storage")
def search_storage_postgres_password(env: Env) -> list[str]:
    return search(env, "--storage", f"postgresql://u:{SECRET}@127.0.0.1:9/db")


@case("storage")
def search_storage_mysql_password(env: Env) -> list[str]:
    return search(env, "--storage", f"mysql://root:{SECRET}@127.0.0.1:9/db")


@case("storage")
def report_storage_postgres_password(env: Env) -> list[str]:
    return ["report", "s", "--storage", f"postgresql://u:{SECRET}@127.0.0.1:9/db"]


@case("not an http(s) URL")
def bench_url_not_http(env: Env) -> list[str]:
    return ["bench", "--url", f"ftp://u:{SECRET}@h/", "--model", "m"]


# -- late or internal errors --------------------------------------------------
@case("log range")
def space_log_low_zero(env: Env) -> list[str]:
    env.file("s.yaml", "max_num_seqs: {low: 0, high: 64, log: true}\n")
    return search(env, "--space", "s.yaml")


@case("finite number")
def space_low_nan(env: Env) -> list[str]:
    env.file("s.yaml", "max_num_seqs: {low: .nan, high: 64}\n")
    return search(env, "--space", "s.yaml")


@case("step must be positive")
def space_step_zero(env: Env) -> list[str]:
    env.file("s.yaml", "gpu_memory_utilization: {low: 0.5, high: 0.9, step: 0}\n")
    return search(env, "--space", "s.yaml")


@case("not UTF-8")
def space_binary(env: Env) -> list[str]:
    env.file("s.yaml", bytes(range(256)) * 4)
    return search(env, "--space", "s.yaml")


@case("binary")
def space_nul_bytes(env: Env) -> list[str]:
    env.file("s.yaml", b"max_num_seqs: 8\n\0\0\0")
    return search(env, "--space", "s.yaml")


@case("FIFO")
def space_fifo(env: Env) -> list[str]:
    os.mkfifo(env.work / "s.yaml")
    return search(env, "--space", "s.yaml")


@case("not UTF-8")
def workload_binary(env: Env) -> list[str]:
    env.file("w.yaml", b"\xff\xfe\x00rate")
    return search(env, "--workload", "w.yaml")


@case("not UTF-8")
def dataset_binary_search(env: Env) -> list[str]:
    env.file("d.jsonl", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    return search(env, "--dataset", "d.jsonl")


@case("not UTF-8")
def dataset_binary_bench(env: Env) -> list[str]:
    env.file("d.jsonl", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    return bench(env, "--dataset", "d.jsonl")


@case("max_position_embeddings")
def model_context_string(env: Env) -> list[str]:
    return search(env, "--model", str(env.model(max_position_embeddings="big")))


@case("num_hidden_layers")
def model_negative_layers(env: Env) -> list[str]:
    return search(env, "--model", str(env.model(num_hidden_layers=-4)))


@case("num_attention_heads")
def model_zero_heads(env: Env) -> list[str]:
    return search(env, "--model", str(env.model(num_attention_heads=0)))


@case("num_key_value_heads")
def model_zero_kv_heads(env: Env) -> list[str]:
    return search(env, "--model", str(env.model(num_key_value_heads=0)))


@case("vocab_size")
def model_vocab_float(env: Env) -> list[str]:
    return search(env, "--model", str(env.model(vocab_size=1.5)))


@case("--seed")
def search_seed_negative(env: Env) -> list[str]:
    return search(env, "--seed", "-1")


@case("--seed")
def search_seed_huge(env: Env) -> list[str]:
    return search(env, "--seed", str(2**40))


@case("--levels")
def search_levels_nan(env: Env) -> list[str]:
    return search(env, "--objective", "pareto", "--levels", "nan,2")


@case("--levels")
def search_levels_inf(env: Env) -> list[str]:
    return search(env, "--objective", "pareto", "--levels", "2,inf")


@case("--startup-timeout")
def search_startup_timeout_nan(env: Env) -> list[str]:
    return search(env, "--startup-timeout", "nan")


@case("--startup-timeout")
def search_startup_timeout_negative(env: Env) -> list[str]:
    return search(env, "--startup-timeout", "-1")


@case("--startup-timeout")
def verify_startup_timeout_nan(env: Env) -> list[str]:
    return ["verify", str(env.profile(model=env.model())), "--startup-timeout", "nan"]


@case("--startup-timeout")
def verify_startup_timeout_negative(env: Env) -> list[str]:
    return ["verify", str(env.profile(model=env.model())), "--startup-timeout", "-1"]


@case("--time-budget")
def search_time_budget_nan(env: Env) -> list[str]:
    return search(env, "--time-budget", "nan")


@case("--max-model-len")
def search_max_model_len_zero(env: Env) -> list[str]:
    return search(env, "--max-model-len", "0")


@case("--pick")
def search_pick_negative(env: Env) -> list[str]:
    return search(env, "--study", "s", "--pick", "-1")


@case("bad port")
def bench_port_80x(env: Env) -> list[str]:
    return ["bench", "--url", "http://127.0.0.1:80x", "--model", "m"]


@case("bad port")
def bench_port_out_of_range(env: Env) -> list[str]:
    return ["bench", "--url", "http://127.0.0.1:99999", "--model", "m"]


@case("best")
def verify_profile_best_string(env: Env) -> list[str]:
    return ["verify", str(env.profile(model=env.model(),
                                      **{"metrics.objective.best": "fast"}))]


@case("startup_s")
def verify_profile_startup_nan(env: Env) -> list[str]:
    return ["verify", str(env.profile(model=env.model(),
                                      **{"metrics.startup_s": float("nan")}))]


# Workload values (qtune/load/workload.py checks them).
@case("rate")
def workload_rate_word(env: Env) -> list[str]:
    env.file("w.yaml", "rate: fast\n")
    return search(env, "--workload", "w.yaml")


@case("requests")
def workload_requests_fraction(env: Env) -> list[str]:
    env.file("w.yaml", "requests: 1.5\n")
    return search(env, "--workload", "w.yaml")


@case("--dataset")
def dataset_list_of_ints(env: Env) -> list[str]:
    env.file("d.json", "[1,2,3]\n")
    return search(env, "--dataset", "d.json")


@pytest.mark.parametrize("value", ["nan", "inf", "1e-300"])
@pytest.mark.parametrize("cmd", ["search", "bench"])
def test_rate_values(tmp_path, cmd, value):
    env = Env(tmp_path)
    args = search(env) if cmd == "search" else bench(env)
    check(env, [*args, "--rate", value], "--rate")


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_burstiness_values(tmp_path, value):
    env = Env(tmp_path)
    check(env, [*bench(env), "--rate", "2", "--burstiness", value], "--burstiness")


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("cmd", ["search", "bench"])
def test_duration_values(tmp_path, cmd, value):
    env = Env(tmp_path)
    args = search(env) if cmd == "search" else bench(env)
    check(env, [*args, "--duration", value], "--duration")


# -- the checks every case gets -----------------------------------------------
def check(env: Env, args: list[str], needle: str) -> None:
    before = snapshot(env.work)
    r = run(env, *args)
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 2), out  # 2: a usage error, not ours
    assert "Traceback" not in out and "internal error" not in out, out
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2, out
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), out
    assert needle in lines[0], out
    assert snapshot(env.work) == before, "the working folder changed"
    assert not env.marker.exists(), "the engine's Python was run"
    for s in SECRETS:
        assert s not in out, out
    assert not (env.base / "nonexistent").exists()


@pytest.mark.parametrize("name", list(CASES))
def test_refused(tmp_path, name):
    fn, needle = CASES[name]
    env = Env(tmp_path)
    args = fn(env)
    check(env, args, needle)


# -- what the refusals protect ------------------------------------------------
def test_force_replaces_read_only_and_keeps_it_read_only(tmp_path):
    env = Env(tmp_path)
    sample_profile().save(env.work / "p.yaml")
    ro = env.file("u.service", "old\n", mode=0o444)
    r = run(env, "emit", "p.yaml", "-o", "u.service", "--force")
    assert r.returncode == 0, r.stderr
    assert "ExecStart" in ro.read_text()
    assert stat.S_IMODE(ro.stat().st_mode) == 0o444


def test_report_reads_torn_journal_without_writing(tmp_path):
    env = Env(tmp_path)
    path = env.study()
    with open(path, "ab") as f:
        f.write(b'{"op_code": 4, "wor')
    before = snapshot(env.work)
    r = run(env, "report", "s", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["best_trial"] == 0
    assert snapshot(env.work) == before


def test_bench_masks_url_everywhere(tmp_path):
    """The human header, --json ``urls`` and the CSV's url column of a real
    run against a stand-in server: the password never appears."""
    from tests.fakes.queue import queue_server

    env = Env(tmp_path)
    with queue_server() as url:
        secret_url = url.replace("http://", f"http://user:{SECRET}@")
        common = ["bench", "--url", secret_url, "--model", "queue-model",
                  "--repeat", "2", "--concurrency", "2", "--requests", "4",
                  "--input-len", "8", "--output-len", "2", "--warmup", "0"]
        r = run(env, *common, "--json", "--csv", "r.csv")
        human = run(env, *common)
    assert r.returncode == 0 and human.returncode == 0, r.stderr + human.stderr
    masked = secret_url.replace(SECRET, "***")
    assert json.loads(r.stdout)["urls"] == [masked]
    csv_text = (env.work / "r.csv").read_text()
    assert masked in csv_text
    assert masked in human.stdout + human.stderr
    for text in (r.stdout, r.stderr, csv_text, human.stdout, human.stderr):
        assert SECRET not in text


def test_bench_reaches_a_password_protected_server_without_model(tmp_path):
    """``--url http://user:pw@host`` with no ``--model``: the listing (urllib)
    sends the user-info as Basic auth like the load (aiohttp) does, and the
    password shows nowhere."""
    import base64

    from aiohttp import web

    from tests.fakes.sse import Threaded

    good = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    seen: list[str] = []

    def gate(request: web.Request) -> None:
        seen.append(request.path)
        if request.headers.get("Authorization") != good:
            raise web.HTTPUnauthorized()

    async def models(request: web.Request) -> web.Response:
        gate(request)
        return web.json_response({"data": [{"id": "m", "root": None}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        gate(request)
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"choices": [{"index": 0, "text": " x"}]}\n\n')
        usage = {"prompt_tokens": 8, "completion_tokens": body["max_tokens"]}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                         + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    env = Env(tmp_path)
    with Threaded({"GET /v1/models": models, "POST /v1/completions": completions}) as url:
        r = run(env, "bench", "--url", url.replace("http://", f"http://user:{SECRET}@"),
                "--concurrency", "1", "--requests", "3", "--input-len", "8",
                "--output-len", "2", "--warmup", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["completed"], out["failed"], out["models"]) == (3, 0, ["m"])
    assert "/v1/models" in seen and "/v1/completions" in seen
    assert SECRET not in r.stdout + r.stderr


def test_redact_shapes():
    from qtune.errors import mask_url, redact

    for tok in ("hf_abcdef", "ghp_" + "a" * 36, "gho_" + "b" * 36, "ghs_" + "c" * 36,
                "github_pat_" + "A1_" * 10, "sk-" + "x" * 20, "xoxb-1234567890-abc",
                "xoxp-1234567890-abc", "AKIA" + "A" * 16, "ASIA" + "B1" * 8):
        assert tok not in redact(f"x {tok} y"), tok
    assert redact("hf_abcde") == "hf_abcde"  # 5 after the prefix: a word
    assert redact("postgresql://u:pw@host/db") == "postgresql://u:***@host/db"
    assert redact("postgresql://u:p@ss@host/db") == "postgresql://u:***@host/db"
    assert mask_url("http://user:pass@h:8000/v1") == "http://user:***@h:8000/v1"
    assert mask_url("http://h:8000") == "http://h:8000"
    assert "pass" not in mask_url("http://u:pass@h:80x")
