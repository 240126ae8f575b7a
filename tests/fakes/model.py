"""A model folder with only a config.json (no weights, no tokenizer): enough
for qtune.model to read the architecture and size the space."""

from __future__ import annotations

import json
from pathlib import Path


def make_model(path: Path, **over) -> Path:
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960}
    cfg.update(over)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path
