"""Issue 28's hostile corpus, our own: every command given inputs an
attacker would give, each through the real CLI (``cli.main``), checked by
``harness.check_outcome`` (exit code, no traceback or internal error, no raw
escape, no secret in any output or written file, in time) and a snapshot
of the working folder (nothing written but the allowed targets, inputs
unchanged)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.fakes.profile import sample_profile
from tests.security import hostile_server as hs
from tests.security.harness import SECRET, changed, check_outcome, run_cli, snapshot

FORMATS = ("systemd", "compose", "kubernetes", "prometheus-rules", "grafana", "host")


@dataclass
class Env:
    work: Path
    url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def profile(self, change: Callable[[dict[str, Any]], None] | None = None,
                raw: str | bytes | None = None, name: str = "p.yaml") -> str:
        p = self.work / name
        if raw is not None:
            p.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        else:
            d = sample_profile().model_dump(mode="json")
            if change:
                change(d)
            p.write_text(yaml.safe_dump(d, sort_keys=False))
        return name


@dataclass
class Case:
    id: str
    args: Callable[[Env], list[str]]
    rcs: tuple[int, ...] = (1,)
    routes: Callable[[Env], dict[str, hs.Route]] | None = None
    may_write: tuple[str, ...] = ()  # paths (relative) that may change


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        for k in head:
            d = d.setdefault(k, {})
        d[last] = value
    return change


def _argv(*extra: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["argv"].extend(extra)


def _good_yaml() -> str:
    return yaml.safe_dump(sample_profile().model_dump(mode="json"), sort_keys=False)


# -- hostile profiles: (id, how to write it, exit codes) -------------------
ALIAS_BOMB = _good_yaml() + "x0: &a [1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"x{i}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 8) + "]\n"
    for i in range(1, 9))
PROFILES: list[tuple[str, Callable[[Env], str], tuple[int, ...]]] = [
    ("alias-bomb", lambda e: e.profile(raw=ALIAS_BOMB), (1,)),
    ("duplicate-key", lambda e: e.profile(raw=_good_yaml() + "name: other\n"), (1,)),
    ("deep-nesting", lambda e: e.profile(raw=_good_yaml() + "notes: " + "[" * 300
                                         + "]" * 300 + "\n"), (1,)),
    ("merge-key", lambda e: e.profile(raw=_good_yaml() + "<<: {a: 1}\n"), (1,)),
    ("startup-1e300", lambda e: e.profile(_set("metrics.startup_s", 1e300)), (1,)),
    ("startup-inf", lambda e: e.profile(_set("metrics.startup_s", float("inf"))), (1,)),
    ("best-nan", lambda e: e.profile(_set("metrics.objective.best", float("nan"))), (1,)),
    ("best-inf", lambda e: e.profile(_set("metrics.objective.best", float("inf"))), (1,)),
    ("cpus-unicode-digits", lambda e: e.profile(
        _set("placement", {"numa_node": 0, "cpus": "\u0660-\u0663"})), (1,)),
    ("int-5000-digits", lambda e: e.profile(
        raw=_good_yaml().replace("max_num_seqs: 8", "max_num_seqs: " + "9" * 5000)), (1,)),
    ("argv-api-ke", lambda e: e.profile(_argv("--api-ke", SECRET)), (1,)),
    ("argv-api-k-eq", lambda e: e.profile(_argv(f"--api-k={SECRET}")), (1,)),
    ("argv-po", lambda e: e.profile(_argv("--po", "9000")), (1,)),
    ("argv-api-key", lambda e: e.profile(_argv(f"--api-key={SECRET}")), (1,)),
    ("argv-token-shape", lambda e: e.profile(_argv("--x", "sk-" + "q" * 24)), (1,)),
    ("storage-libpq-password", lambda e: e.profile(
        _set("study.storage", f"postgresql://u@db/x?password={SECRET}")), (1,)),
    ("storage-reserved-password", lambda e: e.profile(
        _set("study.storage", f"postgresql://u:{SECRET}/#?@db/x")), (1,)),
    ("env-token", lambda e: e.profile(_set("env.HF", "hf_abcdefghijkl")), (1,)),
    ("model-id-escape", lambda e: e.profile(_set("model.id", "\x1b[31mred")), (1,)),
    ("model-id-markup", lambda e: e.profile(_set("model.id", "evil[/][bold]")), (0, 1)),
    ("served-name-template", lambda e: e.profile(
        _set("model.served_name", "{{ $labels.x }}${__all}")), (0, 1)),
    ("not-utf8", lambda e: e.profile(raw=b"name: \xff\xfe\n"), (1,)),
    ("nul-bytes", lambda e: e.profile(raw=b"name: a\x00b\n"), (1,)),
    ("empty", lambda e: e.profile(raw=""), (1,)),
    ("top-level-list", lambda e: e.profile(raw="- a\n- b\n"), (1,)),
    ("huge-file", lambda e: e.profile(raw=_good_yaml() + "# " + "x" * (5 << 20) + "\n"),
     (1,)),
    ("long-notes-64k", lambda e: e.profile(_set("notes", ["a" * 60000] * 17)), (0,)),
]


def _emit_cases() -> list[Case]:
    cases = []
    for pid, write, rcs in PROFILES:
        # (the slow 64 KB case on two formats: the redaction's speed is the point)
        for fmt in FORMATS[:2] if pid == "long-notes-64k" else FORMATS:
            def args(e: Env, write: Any = write, fmt: str = fmt) -> list[str]:
                return ["emit", write(e), "--format", fmt]
            cases.append(Case(f"emit-{fmt}-{pid}", args, rcs))
    return cases


def _out(target: Callable[[Env], str], rcs: tuple[int, ...] = (1,),
         may: tuple[str, ...] = ()) -> Callable[[str], Case]:
    def make(cid: str) -> Case:
        return Case(cid, lambda e: ["emit", e.profile(), "-f", "systemd", "-o", target(e)],
                    rcs, may_write=may)
    return make


def _hardlink(e: Env) -> str:
    e.profile()
    os.link(e.work / "p.yaml", e.work / "hard.yaml")
    return "hard.yaml"


def _symlink(to: str) -> Callable[[Env], str]:
    def make(e: Env) -> str:
        (e.work / "victim.txt").write_text("ORIGINAL\n")
        os.symlink(to, e.work / "link")
        return "link"
    return make


def _readonly(e: Env) -> str:
    (e.work / "ro.service").write_text("KEEP\n")
    (e.work / "ro.service").chmod(0o444)
    return "ro.service"


OUTPUTS = [
    _out(lambda e: "p.yaml")("emit-o-onto-profile"),
    _out(_hardlink)("emit-o-hardlink-to-profile"),
    _out(_symlink("p.yaml"))("emit-o-symlink-to-profile"),
    _out(_symlink("victim.txt"))("emit-o-symlink-to-victim"),
    _out(lambda e: "x" * 300)("emit-o-name-300"),
    _out(lambda e: "a\nerror: forged", (0, 1), ("a\nerror: forged",))("emit-o-newline"),
    _out(lambda e: "missing/dir/unit")("emit-o-missing-folder"),
    _out(lambda e: "/dev/null")("emit-o-dev-null"),
    _out(lambda e: ".")("emit-o-folder"),
    _out(_readonly)("emit-o-read-only"),
    _out(lambda e: "", (1, 2))("emit-o-empty"),
    _out(lambda e: "ok.service", (0,), ("ok.service",))("emit-o-plain"),
]


# -- servers ----------------------------------------------------------------
def _bench(*extra: str, url: Callable[[Env], str] = lambda e: e.url) -> Callable[[Env], list[str]]:
    return lambda e: ["bench", "--url", url(e), "--requests", "2", "--concurrency", "1",
                      "--input-len", "4", "--output-len", "3", "--no-server-metrics", *extra]


def _models(*ids: str) -> Callable[[Env], dict[str, hs.Route]]:
    return lambda e: {"/v1/models": hs.models(*ids),
                      "/v1/completions": hs.sse(*hs.text_events())}


def _with_creds(e: Env) -> str:
    return e.url.replace("http://", f"http://alice:{SECRET}@")


def _redirect_routes(status: int) -> Callable[[Env], dict[str, hs.Route]]:
    def routes(e: Env) -> dict[str, hs.Route]:
        other = e.extra["other"]
        return {"/v1/models": hs.redirect(other + "/v1/models", status)}
    return routes


DEEP = ("[" * 5000 + "]" * 5000).encode()
SERVER_CASES = [
    Case("bench-model-markup", _bench(), (0,), _models("evil[/]")),
    Case("bench-model-escape", _bench(), (0,), _models("\x1b[31mred\x1b]0;t\x07")),
    Case("bench-model-markup-json", _bench("--json"), (0,), _models("evil[/]")),
    Case("bench-model-secret-json", _bench("--json"), (0,), _models("m?token=" + SECRET)),
    Case("bench-csv-formula", _bench("--csv", "out.csv"), (0,), _models("=HYPERLINK(1)"),
         ("out.csv",)),
    Case("bench-models-deep", _bench(), (1,), lambda e: {"/v1/models": hs.raw(DEEP)}),
    Case("bench-models-nan", _bench(), (1,), lambda e: {"/v1/models": hs.raw(
        b'{"data": [{"id": NaN}]}')}),
    Case("bench-models-bigint", _bench(), (1,), lambda e: {"/v1/models": hs.raw(
        b'{"data": [{"id": ' + b"9" * 5000 + b"}]}")}),
    Case("bench-models-not-object", _bench(), (1,), lambda e: {"/v1/models": hs.raw(
        b'"just a string"')}),
    Case("bench-models-empty-list", _bench(), (1,), lambda e: {"/v1/models": hs.raw(
        b'{"data": []}')}),
    Case("bench-models-huge", _bench(), (1,), lambda e: {"/v1/models": hs.huge(40)}),
    Case("bench-models-drip", _bench(), (1,), lambda e: {"/v1/models": hs.drip(60)}),
    Case("bench-models-500-secret", _bench(url=_with_creds), (1,), lambda e: {
        "/v1/models": hs.raw(f"password={SECRET}".encode(), 500)}),
    Case("bench-sse-choices-object", _bench(), (3,), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse({"choices": {"0": 1}})}),
    Case("bench-sse-deep", _bench(), (3,), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse(DEEP)}),
    Case("bench-sse-error-secret-json", _bench("--json"), (3,), lambda e: {
        "/v1/models": hs.models("m"),
        "/v1/completions": hs.sse({"error": {"message": f"bad key sk-{'q' * 24}"}})}),
    Case("bench-sse-nan", _bench(), (0, 3), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse(b'{"choices": NaN}')}),
    Case("bench-url-reserved-password", _bench(url=lambda e: f"http://u:{SECRET}/#?@127.0.0.1:1"),
         (1,)),
    Case("bench-url-token-query", _bench(url=lambda e: f"http://127.0.0.1:1/?api_key={SECRET}"),
         (6,)),  # no server there: exit 6, unreachable (docs/reference/errors.md)
    Case("bench-url-newline", _bench(url=lambda e: "http://127.0.0.1:1/\nerror: forged"), (1,)),
    Case("bench-url-file", _bench(url=lambda e: "file:///etc/passwd"), (1,)),
    Case("check-model-markup", lambda e: ["check", e.profile(), "--url", e.url,
                                          "--requests", "2"], (4, 5),
         _models("evil[/]")),
    Case("check-redirect-creds", lambda e: ["check", e.profile(), "--url", _with_creds(e),
                                            "--requests", "2"], (1, 4, 5),
         _redirect_routes(302)),
    Case("check-models-huge", lambda e: ["check", e.profile(), "--url", e.url,
                                         "--requests", "2"], (1, 4, 5),
         lambda e: {"/v1/models": hs.huge(40)}),
    Case("check-url-password", lambda e: ["check", e.profile(), "--url",
                                          f"http://u:{SECRET}@127.0.0.1:1"], (6,)),
]
def _tokenizer(text: str) -> Callable[[Env], list[str]]:
    def args(e: Env) -> list[str]:
        (e.work / "tok").mkdir()
        (e.work / "tok" / "tokenizer.json").write_text(text)
        return _bench("--tokenizer", "tok")(e)
    return args


_METRICS_NAN = (b"vllm:num_requests_running{model_name=\"m\"} NaN\n"
                b"vllm:request_success_total{model_name=\"m\"} NaN\n"
                b"vllm:prefix_cache_hits_total{model_name=\"m\"} +Inf\n")
SERVER_CASES += [
    Case("bench-tokenizer-deep", _tokenizer("[" * 5000 + "]" * 5000), (0, 1)),
    Case("bench-tokenizer-garbage", _tokenizer("not json"), (0, 1)),
    Case("bench-tokenizer-nan", _tokenizer('{"model": NaN}'), (0, 1)),
    Case("bench-metrics-nan", lambda e: _bench()(e)[:-1], (0,), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse(*hs.text_events()),
        "/metrics": hs.raw(_METRICS_NAN)}),
    Case("check-metrics-nan", lambda e: ["check", e.profile(), "--url", e.url,
                                         "--requests", "2"], (4, 5), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse(*hs.text_events()),
        "/metrics": hs.raw(_METRICS_NAN)}),
    Case("check-metrics-huge", lambda e: ["check", e.profile(), "--url", e.url,
                                          "--requests", "2"], (4, 5), lambda e: {
        "/v1/models": hs.models("m"), "/v1/completions": hs.sse(*hs.text_events()),
        "/metrics": hs.huge(20)}),
]
for _status in (301, 302, 303, 307, 308):
    SERVER_CASES.append(Case(f"bench-redirect-{_status}-with-creds", _bench(url=_with_creds),
                             (1,), _redirect_routes(_status)))


# -- studies ---------------------------------------------------------------
def _journal(e: Env, name: str = "s") -> Path:
    (e.work / "studies").mkdir(exist_ok=True)
    path = e.work / "studies" / f"{name}.log"
    from optuna.storages.journal import JournalFileBackend

    st = optuna.create_study(study_name=name, storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(path))))
    st.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    return path


def _journal_raw(e: Env, text: str) -> None:
    (e.work / "studies").mkdir(exist_ok=True)
    (e.work / "studies" / "s.log").write_text(text)


STUDY_CASES = [
    Case("report-sqlite-hash", lambda e: ["report", "s", "--storage",
                                          f"sqlite:///{e.work}/st#x.db"], (1,)),
    Case("report-sqlite-question", lambda e: ["report", "s", "--storage",
                                              f"sqlite:///{e.work}/st?x.db"], (1,)),
    Case("report-libpq-password", lambda e: [
        "report", "s", "--storage", f"postgresql://u@127.0.0.1:1/db?password={SECRET}"],
        (1,)),
    Case("report-userinfo-reserved", lambda e: [
        "report", "s", "--storage", f"postgresql://u:{SECRET}/?#@127.0.0.1:1/db"], (1,)),
    Case("report-journal-missing-keys", lambda e: (
        _journal_raw(e, '{"op_code": 0}\n{"op_code": 5}\n'), ["report", "s"])[1], (1,)),
    Case("report-journal-deep", lambda e: (
        _journal_raw(e, "[" * 5000 + "]" * 5000 + "\n"), ["report", "s"])[1], (1,)),
    Case("report-journal-not-json", lambda e: (
        _journal_raw(e, "garbage\n"), ["report", "s"])[1], (1,)),
    Case("report-csv-onto-journal", lambda e: (
        _journal(e), ["report", "s", "--csv", "studies/s.log"])[1], (1,)),
    Case("report-html-onto-journal", lambda e: (
        _journal(e), ["report", "s", "--html", "studies/s.log", "--force"])[1], (1,)),
    Case("report-missing-study", lambda e: ["report", "nope"], (1,)),
    Case("report-study-traversal", lambda e: ["report", "../../etc/passwd"], (1,)),
    Case("dashboard-not-installed", lambda e: ["dashboard", "s"], (1,)),
    Case("storage-proxy-password", lambda e: [
        "storage-proxy", "--storage", f"postgresql://u:{SECRET}@127.0.0.1:1/db?password=x",
        "--port", "1"], (1,)),
    Case("storage-proxy-libpq", lambda e: [
        "storage-proxy", "--storage", f"postgresql://u@127.0.0.1:1/db?password={SECRET}",
        "--port", "1"], (1,)),
    Case("storage-proxy-bad-port", lambda e: [
        "storage-proxy", "--storage", "sqlite:///x.db", "--port", "99999"], (1, 2)),
    Case("search-pick-out-onto-journal", lambda e: (
        _journal(e), ["search", "--study", "s", "--pick", "0", "--out", "studies/s.log"])[1],
         (1,)),
    Case("search-space-alias", lambda e: (
        (e.work / "sp.yaml").write_text(ALIAS_BOMB), ["search", "--space", "sp.yaml"])[1],
         (1,)),
    Case("search-space-duplicate", lambda e: (
        (e.work / "sp.yaml").write_text("a: 1\na: 2\n"), ["search", "--space", "sp.yaml"])[1],
         (1,)),
    Case("search-space-deep", lambda e: (
        (e.work / "sp.yaml").write_text("[" * 300 + "]" * 300),
        ["search", "--space", "sp.yaml"])[1], (1,)),
    Case("search-study-traversal", lambda e: ["search", "--study", "../x"], (1,)),
    Case("search-storage-libpq", lambda e: [
        "search", "--storage", f"postgresql://u@127.0.0.1:1/db?password={SECRET}"], (1,)),
    Case("search-out-name-300", lambda e: ["search", "--out", "x" * 300], (1,)),
    Case("search-out-missing-folder", lambda e: ["search", "--out", "no/such/p.yaml"], (1,)),
    Case("verify-alias", lambda e: ["verify", e.profile(raw=ALIAS_BOMB)], (1,)),
    Case("verify-against-duplicate", lambda e: [
        "verify", e.profile(), "--against", e.profile(raw="name: a\nname: b\n", name="o.yaml")],
        (1,)),
    Case("verify-argv-abbrev", lambda e: ["verify", e.profile(_argv("--api-ke", SECRET))], (1,)),
    Case("probe-capture-onto-file", lambda e: (
        (e.work / "f").write_text("x"), ["probe", "--capture", "f"])[1], (1,)),
    Case("probe-capture-missing-parent", lambda e: ["probe", "--capture", "a/b/c"], (1,)),
]


def _capture_link(e: Env) -> list[str]:
    (e.work / "victim.txt").write_text("ORIGINAL\n")
    (e.work / "cap").mkdir()
    os.symlink("../victim.txt", e.work / "cap" / "nvml.json")
    os.symlink("../victim.txt", e.work / "cap" / "gpus.json")
    return ["probe", "--capture", "cap", "--json"]


STUDY_CASES.append(Case("probe-capture-link-inside", _capture_link, (1,), may_write=("cap",)))

CASES = _emit_cases() + OUTPUTS + SERVER_CASES + STUDY_CASES


_UNICODE_ARGS = [
    ("input-len", ["--input-len", "\u0663\u0662"]),
    ("output-len", ["--output-len", "\u0661-\u0669"]),
    ("input-len-huge", ["--input-len", "9" * 5000]),
    ("input-len-normal", ["--input-len", "normal:\u0663:1"]),
]
CASES += [Case(f"bench-unicode-{name}", lambda e, extra=extra: [
    "bench", "--url", "http://127.0.0.1:1", *extra], (1, 2)) for name, extra in _UNICODE_ARGS]
CASES.append(Case("bench-csv-onto-dataset", lambda e: (
    (e.work / "d.jsonl").write_text('{"prompt": "hi"}\n'),
    [*_bench("--dataset", "d.jsonl", "--csv", "d.jsonl")(e)])[1], (1,), _models("m")))
CASES.append(Case("search-levels-unicode", lambda e: [
    "search", "--objective", "pareto", "--levels", "\u0661,\u0662"], (1, 2)))


def _may(rel: str, allowed: tuple[str, ...]) -> bool:
    return any(rel == a or rel.startswith(a + "/") for a in allowed)


@pytest.fixture(scope="module")
def servers() -> Any:
    """One server a case configures (its routes reset per case), and the
    other host a redirect names, which records what reaches it."""
    with hs.Server({}) as url, hs.Server({}) as other_url:
        yield (hs.SERVERS[url], hs.SERVERS[other_url])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: Case, servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    main, other = servers
    main.routes.clear()
    main.seen.clear()
    other.routes.clear()
    other.routes["/v1/models"] = hs.models("m")
    other.seen.clear()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # A shorter whole-request deadline: the drip cases then wait 2 s, not 10.
    monkeypatch.setattr("qtune.load.http.DEADLINE_S", 2.0, raising=False)
    env = Env(work, url=main.url, extra={"other": other.url})
    args = case.args(env)
    if case.routes:
        main.routes.update(case.routes(env))
    before = snapshot(tmp_path)
    rc, out, err, took = run_cli(args, monkeypatch, capsys)
    after = snapshot(tmp_path)
    # Credentials never reach a host a redirect names.
    assert not any("authorization" in {k.lower() for k in h} for _, _, h in other.seen), \
        other.seen
    diff = {d for d in changed(before, after)
            if not _may(d.removeprefix("work/"), case.may_write)}
    assert not diff, f"wrote outside its targets: {sorted(diff)}"
    written = [tmp_path / d for d in changed(before, after)]
    check_outcome(rc, out, err, took, case.rcs, written)
    if (work / "victim.txt").exists():
        assert (work / "victim.txt").read_text() == "ORIGINAL\n"
    if case.id == "bench-csv-formula":
        assert "=HYPERLINK" not in (work / "out.csv").read_text().replace("'=HYPERLINK", "")


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {c.id.split("-")[0] for c in CASES}
    assert {"emit", "bench", "check", "report", "search", "verify", "probe",
            "dashboard", "storage"} <= commands


if __name__ == "__main__":  # pragma: no cover
    print(len(CASES), json.dumps(sorted({c.id.split('-')[0] for c in CASES})),
          file=sys.stderr)

