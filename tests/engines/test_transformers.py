"""The ``transformers serve`` adapter against Transformers 5.19's own CLI (its
options as the installed click command gave them, tests/engines/fixtures/)
and, where the installed package is at hand, its request schema.  The real
server runs in tests/test_e2e_transformers.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from qtune.engines import get_engine
from qtune.engines.base import SpaceContext
from qtune.engines.transformers import Transformers
from qtune.host.installed import EngineInstall
from qtune.load.client import build_body
from qtune.model import resolve_model
from tests.engines.conftest import ENG_FIX
from tests.fakes.model import make_model

ARGS = json.loads((ENG_FIX / "transformers-5.19.0-serve-args.json").read_text())


@pytest.fixture
def ctx(cpu_host, tmp_path):
    model = resolve_model(str(make_model(tmp_path / "m")))
    model = dataclasses.replace(model, has_weights=True)
    install = EngineInstall("transformers", "5.19.0", "cpu", "/opt/venv/bin/python")
    return SpaceContext(cpu_host, model, install, engine_args=ARGS["args"])


def test_the_space_is_the_installed_cli_s(ctx):
    e = get_engine("transformers")
    params = e.space(ctx)
    assert {p.name for p in params if p.target == "flag"} <= set(ARGS["args"])
    names = {p.name for p in params if not p.opt_in}
    # CPU: the cache in blocks, never as a fraction of the host's RAM
    assert {"cb_num_blocks", "cb_max_batch_tokens", "attn_implementation"} <= names
    assert not {"cb_max_memory_percent", "cb_use_cuda_graph"} & names
    # torch's threads, seeded at half the cores (they spin while waiting)
    (threads,) = [p for p in params if p.name == "OMP_NUM_THREADS"]
    assert threads.target == "env" and threads.low == 1 and threads.high >= 2
    ((seed, why),) = e.seeds(params, ctx, {})
    assert seed == {"OMP_NUM_THREADS": int(threads.high) // 2} and "thread" in why
    spec = e.launch_spec(seed, ctx, host="h", port=1)
    assert spec.env["OMP_NUM_THREADS"] == str(seed["OMP_NUM_THREADS"])
    assert "OMP_NUM_THREADS" not in " ".join(spec.argv)
    # a release without an option drops it from the space
    older = {k: v for k, v in ARGS["args"].items() if k != "cb_max_batch_tokens"}
    assert "cb_max_batch_tokens" not in {
        p.name for p in e.space(dataclasses.replace(ctx, engine_args=older))}


def test_the_launch_is_serve_with_continuous_batching_and_a_bounded_cache(ctx):
    e = Transformers()
    base, note = e.baseline(ctx)
    assert base["cb_num_blocks"] and note and "RAM" in note
    spec = e.launch_spec({"compile": False, "attn_implementation": "eager"}, ctx,
                         host="127.0.0.1", port=8123)
    argv = list(spec.argv)
    assert argv[1:5] == ["-m", "transformers.cli.transformers", "serve", str(ctx.model.path)]
    assert "--continuous-batching" in argv and argv[argv.index("--device") + 1] == "cpu"
    # the cache is set on CPU even when the space does not tune it
    assert "--cb-num-blocks" in argv
    # a switch pair: off is its --no- form; a value follows its flag
    assert "--no-compile" in argv and argv[argv.index("--attn-implementation") + 1] == "eager"
    # readiness: /health alone (its /v1/models lists the hub cache); the
    # request names the model by the path the server was given
    assert spec.models_path is None and spec.health_path == "/health"
    assert spec.served_model == str(ctx.model.path)
    assert e.command_words().split(spec.argv) is not None


def test_checks_refuse_what_cannot_start(ctx):
    e = Transformers()
    assert e.check({}, ctx) == []
    shape_only = dataclasses.replace(ctx, model=dataclasses.replace(ctx.model,
                                                                    has_weights=False))
    assert any("weights" in v for v in e.check({}, shape_only))
    assert any("less than one" in v for v in e.check({"cb_num_blocks": 1}, ctx))


def test_honest_capabilities():
    """No /metrics, no cache reset, no log-probabilities: said by the hooks'
    "none" answers, so the run says its hit rate is unchecked and the trial
    says quality is not measured."""
    e = Transformers()
    assert e.metric_names() is None and e.cache_reset_paths() == ()
    assert e.logprobs_request("m", "text") is None
    assert e.image("cuda", "5.19.0") is None
    assert e.classify("ERROR:    [Errno 98] error while attempting to bind on address "
                      "('127.0.0.1', 8000): address already in use").reason == "port_in_use"
    assert e.classify("torch.OutOfMemoryError: CUDA out of memory").reason == "oom"
    assert e.memory_asks("CUDA out of memory") == ("cb_num_blocks", "cb_max_memory_percent")


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None
                    or importlib.util.find_spec("transformers") is None,
                    reason="transformers[serving] not installed")
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_every_request_field_is_one_the_installed_server_takes(endpoint):
    """The server refuses (422) a field outside its schema, as ``ignore_eos``
    is: the load client's body with this engine's fields passes the
    installed version's own check."""
    if endpoint == "chat":
        from transformers.cli.serving.chat_completion import ChatCompletionHandler as H
    else:
        from transformers.cli.serving.completion import CompletionHandler as H
    allowed = H._valid_params_class.__mutable_keys__
    body = build_body(endpoint, "m", "p", 4, Transformers().request_fields())
    assert set(body) <= allowed
    assert "ignore_eos" not in allowed  # why the engine has its own fields
    assert json.loads(body["generation_config"]) == {"eos_token_id": -1}
