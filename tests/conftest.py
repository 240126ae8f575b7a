from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from qtune.engines.base import SpaceContext
from qtune.host import probe
from qtune.host.installed import EngineInstall
from qtune.model import resolve_model

FIX = Path(__file__).parent / "fixtures"


class NoNVML:
    def nvmlInit(self) -> None:
        raise OSError("NVML Shared Library Not Found")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Generated tokenizers and the embedded model go to a per-session cache,
    # never the user's.
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache"))


@pytest.fixture
def cpu_host():
    return probe(root=FIX / "hosts" / "epyc-2c-1node", nvml=NoNVML(),
                 engine_python=sys.executable)


def make_model(path: Path, **over) -> Path:
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "num_hidden_layers": 36, "hidden_size": 2560, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960}
    cfg.update(over)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture
def cpu_ctx(cpu_host, tmp_path):
    model = resolve_model(str(make_model(tmp_path / "m")))
    install = EngineInstall("vllm", "0.32.0", "cpu", "/opt/venv/bin/python")
    return SpaceContext(cpu_host, model, install)
