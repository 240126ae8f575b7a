"""Resolve the model to tune, and build the embedded default model offline.

A model is a folder with ``config.json``.  qtune reads it for the shape
(layers, heads, KV heads, context length) and decides:

- ``--load-format dummy`` when the folder has no weights (random weights:
  tune a model's shape before downloading it);
- a tokenizer: the folder's own, else a word-level tokenizer generated for the
  config's ``vocab_size`` (one word per id, so text decodes and re-encodes to
  the same ids: prompts have exact token lengths).

Without ``--model`` qtune tunes its embedded default: a tiny Qwen2-shaped
config built here once and cached, served with random weights.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qtune.errors import ModelError

EMBEDDED_NAME = "qtune-tiny-qwen2"
_EMBEDDED_VERSION = 1
# Small enough that a 2-core CPU serves it at tens of requests per second,
# large enough that batching and KV size change latency measurably.
_EMBEDDED_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 8192,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "use_sliding_window": False,
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_SPECIALS = ["<|endoftext|>", "<|im_end|>", "<unk>"]


@dataclass(frozen=True)
class ModelInfo:
    """What qtune knows about the model it tunes."""

    path: Path
    served_name: str
    source: str  # "embedded" | "local" | "hf-cache"
    hf_id: str | None
    config: dict[str, Any]
    tokenizer_dir: Path
    has_weights: bool

    @property
    def load_format(self) -> str | None:
        return None if self.has_weights else "dummy"

    def _text_config(self) -> dict[str, Any]:
        # Multimodal configs nest the language model's shape.
        return self.config.get("text_config") or self.config

    @property
    def num_layers(self) -> int:
        return int(self._text_config().get("num_hidden_layers", 0))

    @property
    def num_heads(self) -> int:
        return int(self._text_config().get("num_attention_heads", 0))

    @property
    def num_kv_heads(self) -> int:
        c = self._text_config()
        return int(c.get("num_key_value_heads") or c.get("num_attention_heads", 0))

    @property
    def head_dim(self) -> int:
        c = self._text_config()
        return int(
            c.get("head_dim")
            or c.get("hidden_size", 0) // max(c.get("num_attention_heads", 1), 1)
        )

    @property
    def max_context(self) -> int:
        c = self._text_config()
        return int(c.get("max_position_embeddings") or c.get("max_seq_len") or 2048)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.hf_id or self.served_name,
            "path": str(self.path),
            "source": self.source,
            "served_name": self.served_name,
            "architecture": (self.config.get("architectures") or ["?"])[0],
            "layers": self.num_layers,
            "heads": self.num_heads,
            "kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_context": self.max_context,
            "load_format": self.load_format or "auto",
        }


def cache_dir() -> Path:
    base = os.environ.get("QTUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qtune"
    )
    return Path(base)


def resolve_model(spec: str | None) -> ModelInfo:
    """``None`` → the embedded model; a folder → that folder; otherwise a
    Hugging Face id that must already be in the local cache (qtune never
    downloads weights: a trial must not measure a download)."""
    if spec is None:
        path = embedded_model()
        return _info(path, EMBEDDED_NAME, "embedded", None)
    p = Path(spec).expanduser()
    if p.exists() or spec.startswith((".", "/", "~")):
        if not p.is_dir():
            raise ModelError(
                f"model path {spec} is not a folder",
                hint="--model takes a folder with config.json, or a Hugging Face id "
                "already in the local cache",
            )
        if not (p / "config.json").is_file():
            raise ModelError(
                f"model folder {spec} has no config.json",
                hint="point --model at the folder that holds config.json",
            )
        return _info(p.resolve(), p.resolve().name, "local", None)
    if spec == "smollm2-135m":
        # The real embedded model, built on first use; imported here so that
        # its optional dependencies stay out of every other command's start.
        from qtune.realmodel import REAL_NAME, real_model

        return _info(real_model(cache_dir() / "models"), REAL_NAME, "embedded", None)
    snap = _hf_cache_snapshot(spec)
    if snap is None:
        raise ModelError(
            f"model {spec!r} is neither a local folder nor in the Hugging Face cache",
            hint=f"download it first (huggingface-cli download {spec}) or pass the "
            "folder path; to tune the shape only, a folder with just config.json "
            "works",
        )
    return _info(snap, spec, "hf-cache", spec)


def _hf_cache_snapshot(repo_id: str) -> Path | None:
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or os.path.join(
            os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"),
            "hub",
        )
    )
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if (snap / "config.json").is_file():
            return snap
    snaps = sorted((repo / "snapshots").glob("*/config.json"))
    return snaps[-1].parent if snaps else None


def _info(path: Path, served: str, source: str, hf_id: str | None) -> ModelInfo:
    from qtune.untrusted import loads

    try:
        # Bounded (size, depth, finite numbers): a config.json is untrusted.
        config = loads((path / "config.json").read_bytes(), "config.json")
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read {path / 'config.json'}: {exc}",
            hint="the file must be the model's JSON config",
        ) from None
    if not isinstance(config, dict):
        raise ModelError(f"{path / 'config.json'} is not a JSON object",
                         hint="config.json must be the model's Hugging Face config")
    _check_shape(config, path / "config.json")
    has_weights = any(
        f.name.endswith(_WEIGHT_SUFFIXES) for f in path.iterdir() if f.is_file()
    )
    if (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file():
        tok_dir = path
    else:
        tok_dir = generated_tokenizer(int(config.get("vocab_size") or 0))
    return ModelInfo(path, served, source, hf_id, config, tok_dir, has_weights)


# The shape fields qtune computes with: each, when present, a positive
# integer.  A string or a negative count would otherwise surface as an
# internal error deep in the memory estimate or the space.
_SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "hidden_size", "max_position_embeddings", "max_seq_len",
                 "vocab_size", "intermediate_size")


def _check_shape(config: dict[str, Any], where: Path) -> None:
    for c in (config, config.get("text_config")):
        if c is None:
            continue
        if not isinstance(c, dict):
            raise ModelError(f"{where}: text_config is not a JSON object",
                             hint="config.json must be the model's Hugging Face config")
        for key in _SHAPE_FIELDS:
            v = c.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                shown = repr(v) if isinstance(v, (int, float)) else type(v).__name__
                raise ModelError(
                    f"{where}: {key} must be a positive integer, not {shown[:40]}",
                    hint="config.json must be the model's Hugging Face config; fix "
                    "or re-download it",
                )


def embedded_model() -> Path:
    """Create (once) the embedded model folder.  It holds only the config:
    its tokenizer lives in a folder of its own (``generated_tokenizer``),
    because transformers picks the tokenizer class from ``model_type`` when a
    config.json sits beside the tokenizer, and Qwen2's class would rebuild a
    BPE from our word-level vocabulary."""
    dest = cache_dir() / "models" / f"{EMBEDDED_NAME}-v{_EMBEDDED_VERSION}"
    if (dest / "config.json").is_file():
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(_EMBEDDED_CONFIG, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 0}) + "\n"
    )
    try:
        tmp.rename(dest)
    except OSError:  # another qtune made it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def generated_tokenizer(vocab_size: int) -> Path:
    """A word-level tokenizer with exactly ``vocab_size`` ids, for models
    whose folder has no tokenizer (shape-only configs).  Served with
    ``--tokenizer DIR``; the folder must not contain a config.json."""
    if vocab_size < len(_SPECIALS) + 2:
        raise ModelError(
            f"config.json has vocab_size={vocab_size}: cannot build a tokenizer",
            hint="add a tokenizer to the model folder",
        )
    dest = cache_dir() / "tokenizers" / f"wordlevel-{vocab_size}"
    if not (dest / "tokenizer.json").is_file():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        _write_tokenizer(tmp, vocab_size)
        try:
            tmp.rename(dest)
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _write_tokenizer(dest: Path, vocab_size: int) -> None:
    """One token per id: ``<|endoftext|>``, ``<|im_end|>``, ``<unk>``, then
    words ``t3 t4 …``.  Whitespace splitting + space-joined decoding makes
    decode→encode the identity, so a prompt of N ids is exactly N tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    for i in range(len(_SPECIALS), vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(_SPECIALS)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "bos_token": None,
                "unk_token": "<unk>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 1_000_000,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )
