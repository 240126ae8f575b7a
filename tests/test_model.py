"""Model resolution: the embedded model, shape-only folders (dummy weights,
generated tokenizer), the HF cache, and bad paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from qtune.errors import ModelError
from qtune.model import EMBEDDED_NAME, resolve_model

ROOT = Path(__file__).parent.parent


def test_embedded_model_is_built_offline_once():
    m = resolve_model(None)
    assert m.source == "embedded" and m.served_name == EMBEDDED_NAME
    assert m.load_format == "dummy" and m.num_heads % m.num_kv_heads == 0
    assert not (m.tokenizer_dir / "config.json").exists()  # see generated_tokenizer
    assert resolve_model(None).path == m.path


def test_qwen3_4b_shape_example_gets_dummy_weights_and_an_exact_tokenizer():
    m = resolve_model(str(ROOT / "examples" / "qwen3-4b"))
    assert (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim) == (36, 32, 8, 128)
    assert m.max_context == 40960 and m.load_format == "dummy"
    tok = Tokenizer.from_file(str(m.tokenizer_dir / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 151936
    ids = [5, 999, 151935, 42]
    assert tok.encode(tok.decode(ids), add_special_tokens=False).ids == ids


def test_hf_cache_lookup(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"num_hidden_layers": 2,
                                                  "vocab_size": 64}))
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    m = resolve_model("org/m")
    assert m.source == "hf-cache" and m.path == snap and m.served_name == "org/m"
    with pytest.raises(ModelError, match="cache"):
        resolve_model("org/other")


def test_bad_config(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelError, match="JSON object"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelError, match="cannot read"):
        resolve_model(str(tmp_path))
