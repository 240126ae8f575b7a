"""The engine contract: an adapter that writes only the abstract methods
works everywhere with the optional hooks' defaults, and nothing in qtune/
outside qtune/engines/ names vLLM's metrics, flags, image, cache paths or
log lines (an engine is one file and one registry line)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from qtune.engines import ENGINES, gpus_used
from qtune.engines.base import (
    Engine,
    Failure,
    LaunchSpec,
    LoadView,
    Param,
    SpaceContext,
    classify_by_patterns,
)
from qtune.engines.vllm import VLLM
from qtune.load.client import build_body
from tests.conftest import FIX

ROOT = Path(__file__).parents[2] / "qtune"


class Minimal(Engine):
    """Only what ``Engine`` requires."""

    name = "minimal"

    def space(self, ctx: SpaceContext) -> list[Param]:
        return [Param("slots", "int", low=1, high=8)]

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        return {}, None

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        return []

    def launch_spec(self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str,
                    port: int) -> LaunchSpec:
        return LaunchSpec((sys.executable, "-m", "server", "--port", str(port)), {},
                          host, port, ctx.model.served_name)

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, [])


def test_an_engine_missing_a_required_method_cannot_be_made():
    class Half(Engine):
        name = "half"
        space = Minimal.space
        baseline = Minimal.baseline
        check = Minimal.check
        launch_spec = Minimal.launch_spec

    with pytest.raises(TypeError, match="classify"):
        Half()  # type: ignore[abstract]


def test_the_optional_hooks_default_to_nothing_added(cpu_ctx):
    e = Minimal()
    params = e.space(cpu_ctx)
    load = LoadView(rate=1.0, concurrency=None, shared_prefix=False)
    assert e.shape(params, cpu_ctx, load) == (params, {}, [])
    assert e.seeds(params, cpu_ctx, {}) == []
    assert e.memory_asks("less than desired GPU memory utilization") == ()
    assert e.estimate({"slots": 2}, cpu_ctx) is None
    assert e.gpus_used({"slots": 2}) == 1 and gpus_used(e, {}) == 1
    assert e.read_args(cpu_ctx.install) is None
    assert e.metric_names() is None and e.cache_reset_paths() == ()
    assert e.max_model_len(["x", "--max-model-len", "4096"]) is None
    assert e.image("cuda", "1.0") is None and e.cache_volumes() == ()
    # No quality hooks: nothing lossy known, no log-probabilities to score
    # (the trial says "not measured"); greedy text through OpenAI's API.
    assert e.changes_numerics({"slots": 2}) == {}
    assert e.logprobs_request("m", "text") is None
    with pytest.raises(ValueError):
        e.read_logprobs({"choices": [{"prompt_logprobs": [None, {"1": {"logprob": -1}}]}]})
    assert e.greedy_request("m", "p", 4) == ("/v1/completions", {
        "model": "m", "prompt": "p", "max_tokens": 4, "temperature": 0})
    assert e.read_text({"choices": [{"text": " x"}]}) == " x"


def test_a_minimal_engine_deploys_with_the_defaults(monkeypatch):
    """The emitters call the image and cache hooks directly: the defaults
    give no image (--image names one) and no cache volume."""
    from qtune.emit import emit
    from qtune.errors import InputError
    from tests.test_profile import sample_profile

    monkeypatch.setitem(ENGINES, "minimal", Minimal())
    profile = sample_profile(engine={"name": "minimal", "version": "1", "build": "cuda"})
    with pytest.raises(InputError, match="no published image"):
        emit(profile, "compose")
    compose = yaml.safe_load(emit(profile, "compose", image="me/minimal:1"))
    (svc,) = compose["services"].values()
    assert svc["image"] == "me/minimal:1" and "volumes" not in compose
    assert all(v["type"] == "bind" for v in svc["volumes"])
    kube = list(yaml.safe_load_all(emit(profile, "kubernetes", image="me/minimal:1")))
    volumes = kube[0]["spec"]["template"]["spec"]["volumes"]
    # no engine cache volume: only the shared memory, /tmp and the home that
    # every non-root pod gets
    assert [v["name"] for v in volumes if "emptyDir" in v] == ["dshm", "tmp", "home"]


def test_vllm_deploys_can_write_its_compile_cache():
    """The Compose service runs as a non-root user on a read-only root: the
    engine's cache folders, moved to that user's home, lie in a tmpfs it
    owns (rebuilt at a restart, as in a new pod)."""
    from qtune.emit import emit
    from qtune.emit.container import rehome
    from tests.test_profile import sample_profile

    compose = yaml.safe_load(emit(sample_profile(), "compose"))
    svc = next(iter(compose["services"].values()))
    assert svc["read_only"] is True
    writable = [t.split(":")[0] for t in svc["tmpfs"]]
    for v in VLLM().cache_volumes():
        assert any(rehome(v.path).startswith(t + "/") for t in writable), v


def test_the_vllm_adapter_fills_in_every_hook(cpu_ctx):
    v = VLLM()
    names = v.metric_names()
    assert all(getattr(names, f.name) for f in dataclasses.fields(names))
    assert v.cache_reset_paths() and v.cache_volumes()
    assert v.image("cuda", "0.32.0+cu129") == "vllm/vllm-openai:v0.32.0"
    assert v.max_model_len(["p", "-m", "m", "--max-model-len", "4096"]) == 4096
    assert v.max_model_len(["p", "-m", "m"]) is None


# --- vLLM's words outside qtune/engines ---------------------------------------

# Every flag vLLM 0.32's EngineArgs has (250), as the installed vLLM reported it.
_VLLM_FLAGS = {v["flag"] for v in json.loads(
    (FIX / "vllm-0.32.0-cpu-engine-args.json").read_text()).values()}
# Words that are not vLLM's alone: what every OpenAI-compatible server qtune
# runs takes on its command line (vLLM's, SGLang's), which qtune reads back
# from a profile for any engine: the listening address (verify and --pick
# move the port, the container formats open the host) and the model folders
# (verify checks them, the container formats mount them).  ``--seed`` is
# also qtune's own option.
_SHARED_WORDS = {"--host", "--port", "--model", "--tokenizer", "--seed"}


def _vllm_words(ctx: SpaceContext) -> dict[str, set[str]]:
    """What only the vLLM adapter may name, taken from the adapter itself."""
    v = VLLM()
    names = v.metric_names()
    # (the model label, "model_name", is a plain word: other code uses it too)
    metrics = {getattr(names, f.name) for f in dataclasses.fields(names)
               if isinstance(getattr(names, f.name), str)
               and f.name not in ("engine_label", "model_label")}
    metrics |= {a for alts in names.aliases.values() for a in alts}
    spec = v.launch_spec({}, ctx, host="127.0.0.1", port=8000)
    flags = {w for w in spec.argv if w.startswith("--")} | _VLLM_FLAGS
    # the runner's watch patterns that are plain text (not regex syntax)
    log_lines = {p for p in (*spec.fatal_patterns, *spec.idle_patterns)
                 if not set(p) & set("\\()[]*+?")}
    return {
        "metric": metrics,
        # without a version: the repository and the tag's prefix
        "image": {v.image(b, "") or "" for b in ("cuda", "cpu")} - {""},
        "cache path": {c.path for c in v.cache_volumes()} | {c.name for c in v.cache_volumes()}
        | set(v.cache_reset_paths()),
        "log line": log_lines,
        "flag": flags - _SHARED_WORDS,
        **_names(v, ctx),
    }


def _names(engine: Engine, ctx: SpaceContext) -> dict[str, set[str]]:
    """The environment variables and parameter names of ``engine``'s space
    (and its compile cache's variables): other code reaches them through
    the adapter's hooks, never by name."""
    space = engine.space(ctx)
    return {
        "env": {p.name for p in space if p.target == "env"}
        | set(engine.compile_cache_env(Path("/c"))),
        # one-word names ("compile", "dtype", "quantization") are ordinary
        # words elsewhere (a start phase, a config key); snake_case is a name
        "param": {p.name for p in space if p.target != "env" and "_" in p.name},
    }


def _literals(path: Path) -> list[tuple[int, str]]:
    """String literals of a module (f-string parts too), without docstrings:
    comments and docstrings may cite vLLM."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _names_word(kind: str, w: str, text: str) -> bool:
    # A flag is a word of its own; a parameter name is a whole word (the
    # Hugging Face config's "quantization_config" is not vLLM's
    # "quantization"); the rest may sit inside text.
    if kind == "flag":
        return text == w or text.startswith(w + "=")
    if kind == "param":
        return re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w-])", text) is not None
    return w in text


def find_vllm_words(root: Path, words: dict[str, set[str]]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if "engines" in path.relative_to(root).parts:
            continue
        for line, text in _literals(path):
            for kind, ws in words.items():
                hit = [w for w in ws if _names_word(kind, w, text)]
                out += [f"{path.relative_to(root.parent)}:{line}: vLLM {kind} {w!r}"
                        for w in hit]
    return out


@pytest.fixture
def gpu_ctx(tmp_path):
    """vLLM 0.26 CUDA on a captured two-H200 host: the GPU space's names
    (fp8, CUDA graph capture sizes, its compile cache) are not the CPU's."""
    from qtune.engines import probe_host
    from qtune.host.installed import EngineInstall
    from qtune.model import resolve_model
    from tests.engines.conftest import H200X2, replay_nvml
    from tests.fakes.model import make_model

    host = probe_host(root=H200X2, nvml=replay_nvml(H200X2), engine_python=sys.executable)
    model = resolve_model(str(make_model(tmp_path / "qwen3-4b")))
    return SpaceContext(host, model, EngineInstall("vllm", "0.26.0", "cuda", sys.executable))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_only_the_engine_adapter_names_vllm(target, cpu_ctx, gpu_ctx):
    ctx = cpu_ctx if target == "cpu" else gpu_ctx
    words = _vllm_words(ctx)
    assert words["env"] and words["param"]
    assert find_vllm_words(ROOT, words) == []


def _engine_words(engine: Engine, ctx: SpaceContext) -> dict[str, set[str]]:
    """What only ``engine``'s adapter may name: its metric names, image,
    cache paths, the flags of its launch command and space, its log lines."""
    names = engine.metric_names()
    metrics = ({v for f in dataclasses.fields(names)
                if isinstance(v := getattr(names, f.name), str)
                and f.name not in ("engine_label", "model_label")}
               if names else set())
    spec = engine.launch_spec({}, ctx, host="127.0.0.1", port=8000)
    words = engine.command_words()
    flags = {w for w in spec.argv if w.startswith("--")}
    flags |= {engine.launch_spec({p.name: _a_value(p)}, ctx, host="h", port=1).argv[-2]
              for p in engine.space(ctx) if p.target == "flag" and p.kind != "bool"}
    shared = _SHARED_WORDS | {words.host, words.port, *words.model, *words.tokenizer}
    return {
        "metric": metrics,
        # without a version: what comes before it
        "image": {i.split("\0")[0] for b in ("cuda", "cpu", "rocm")
                  if (i := engine.image(b, "\0"))},
        "cache path": {c.path for c in engine.cache_volumes()} | set(engine.cache_reset_paths()),
        "log line": {p for p in (*spec.fatal_patterns, *spec.idle_patterns)
                     if not set(p) & set("\\()[]*+?^")},
        "flag": {f for f in flags if f.startswith("--")} - shared,
        **_names(engine, ctx),
    }


def _a_value(p: Param) -> Any:
    return p.choices[-1] if p.kind == "choice" else p.high


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_no_engine_s_words_outside_its_adapter(name, cpu_ctx):
    """Every registered engine, not only vLLM: its flags, metrics, image,
    cache paths and log lines live in qtune/engines/ alone."""
    e = ENGINES[name]
    words = _engine_words(e, cpu_ctx)
    assert words["flag"]
    # an engine that serves no metrics or publishes no image says so
    # (None), and has no such words to leak
    assert bool(words["metric"]) == (e.metric_names() is not None)
    assert bool(words["image"]) == any(e.image(b, "1") for b in ("cuda", "cpu", "rocm"))
    assert find_vllm_words(ROOT, words) == []


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_keeps_the_contract(name, cpu_ctx):
    """What the runner, the load client, the search and the deploy formats
    call on any engine, called on each one in the registry."""
    e = ENGINES[name]
    assert isinstance(e, Engine) and e.name == name
    params = e.space(cpu_ctx)
    assert all(isinstance(p, Param) for p in params)
    base, note = e.baseline(cpu_ctx)
    assert isinstance(base, dict) and (note is None or isinstance(note, str))
    assert isinstance(e.check(base, cpu_ctx), list)
    spec = e.launch_spec(base, cpu_ctx, host="127.0.0.1", port=8123)
    words = e.command_words()
    split = words.split(spec.argv)
    assert split is not None, spec.argv
    args = split[1]
    assert args[args.index(words.host) + 1] == "127.0.0.1"
    assert args[args.index(words.port) + 1] == "8123"
    assert args[args.index(words.model[0]) + 1] == str(cpu_ctx.model.path)
    assert isinstance(e.classify("Address already in use"), Failure)
    assert e.classify("Address already in use").reason == "port_in_use"
    assert e.gpus_used(base) >= 1
    # What the runner waits for and what the load client sends.
    assert spec.health_path.startswith("/")
    assert spec.models_path is None or spec.models_path.startswith("/")
    fields = e.request_fields()
    assert fields and not set(fields) & set(build_body("completions", "m", "p", 4, {}))
    names = e.metric_names()
    # Metrics and an image are optional, but an engine that has them has
    # the ones the server view and the deploy formats read.
    assert names is None or (names.requests_running and names.request_success)
    assert e.install_hint()


def test_the_check_finds_each_kind(tmp_path, cpu_ctx):
    pkg = tmp_path / "qtune"
    (pkg / "engines").mkdir(parents=True)
    (pkg / "engines" / "x.py").write_text('FLAG = "--kv-cache-dtype"\n')
    (pkg / "a.py").write_text(
        '"""Reads vllm:num_preemptions (a docstring may say so)."""\n'
        "# vllm:prompt_tokens in a comment is fine\n"
        'A = "vllm:num_preemptions"\n'
        'B = f"vllm/vllm-openai:v{1}"\n'
        'C = ["--max-model-len", "--kv-cache-dtype=fp8", "--model"]\n'
        'D = "/root/.cache/vllm"\n'
        'E = r"Engine core initialization failed"\n'
        'F = "set --max-model-len lower"\n'
        'G = {"VLLM_CPU_KVCACHE_SPACE": 4}\n'
        'H = params.get("max_num_seqs")\n'
        'I = "max_num_seqs_hint and max_num_seqs2 are other words"\n')
    found = find_vllm_words(pkg, _vllm_words(cpu_ctx))
    kinds = sorted({f.split(": vLLM ")[1].split(" '")[0] for f in found})
    assert kinds == ["cache path", "env", "flag", "image", "log line", "metric", "param"]
    assert {f.split(":")[1] for f in found} == {"3", "4", "5", "6", "7", "9", "10"}
    assert not any("'--model'" in f for f in found)


def test_only_the_registry_imports_an_adapter():
    """Outside qtune/engines/, code reaches an engine through ``ENGINES`` and
    the ``Engine`` hooks, never through the vLLM adapter's modules."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if "engines" in path.relative_to(ROOT).parts:
            continue
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            mods = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                    [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
            out += [f"{path.name}: {m}" for m in mods if m.startswith("qtune.engines.vllm")]
    assert out == []

