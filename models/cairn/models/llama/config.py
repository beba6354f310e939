"""`LlamaConfig`: the hyperparameters of `llama.Llama` (Llama 1/2/3 and Llama-style decoders)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from cairn.models.transformer_config import DTYPES, ModelConfig, check_prompt_start_id

# The keys of `rope_scaling` (transformers' "llama3" rope type), in the order they are stored.
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_scaling(name: str, value: Any) -> tuple[tuple[str, float], ...] | None:
    """`rope_scaling` as a tuple of `(key, value)` pairs in `ROPE_SCALING_KEYS` order (hashable),
    from a mapping or pairs; `rope_type` may be given and must be "llama3"."""
    if value is None:
        return None
    items = dict(value.items() if isinstance(value, Mapping) else value)
    rope_type = items.pop("rope_type", items.pop("type", "llama3"))
    if rope_type != "llama3":
        raise ValueError(f"{name}.rope_scaling: only rope_type 'llama3' is supported, got {rope_type!r}")
    if set(items) != set(ROPE_SCALING_KEYS):
        raise ValueError(f"{name}.rope_scaling needs exactly the keys {ROPE_SCALING_KEYS}, got {sorted(items)}")
    out = tuple((k, float(items[k])) for k in ROPE_SCALING_KEYS)
    d = dict(out)
    if d["factor"] < 1 or d["original_max_position_embeddings"] < 1:
        raise ValueError(f"{name}.rope_scaling: factor and original_max_position_embeddings must be >= 1, got {d}")
    if not 0 < d["low_freq_factor"] < d["high_freq_factor"]:
        raise ValueError(f"{name}.rope_scaling: need 0 < low_freq_factor < high_freq_factor, got {d}")
    return out


@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Hyperparameters of `llama.Llama`: the shared `ModelConfig` fields (defaults: `llama_150m`,
    SmolLM-135M's shape) and Llama's own.

    * `num_kv_heads`: key/value heads (grouped-query attention; `num_heads` a multiple of it;
      1 is multi-query, `num_heads` plain multi-head attention);
    * `rope_theta`: the RoPE base; `rope_scaling`: None, or transformers' "llama3" frequency
      scaling as a mapping (or pairs) of `ROPE_SCALING_KEYS`, stored as a tuple of pairs;
    * `rms_norm_eps`; `tie_word_embeddings`: logits `x @ embedding.T` (no rescaling) instead of a
      separate `logits` kernel; `init_std`: the normal initializer of every kernel and the embedding;
    * `param_dtype`: the dtype parameters are stored in (`dtype` is the compute dtype; softmax,
      norms and logits are float32 either way);
    * `attention_implementation`: None (the Pallas splash kernel on TPU, cuDNN's fused
      attention on GPU, wherever they apply; XLA's otherwise), "xla", "pallas" (always the
      kernel: `cairn.models.pallas_attention`) or "cudnn" (always `dot_product_attention`'s
      cuDNN attention, NVIDIA GPUs, bf16/fp16 only: `cairn.models.gpu_attention`);
    * `prompt_start_id`: what `predict_batch` puts in front of every prompt: 0 (T5's decoder
      start, Cairn's default), an imported checkpoint's `bos_token_id` (what `llama.hf` sets), or
      None (nothing: the prompt already begins with its BOS); see `check_prompt_start_id`.
    """

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("num_layers",)
    EXTRA_POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ("num_kv_heads",)

    vocab_size: int = 49152
    emb_dim: int = 576
    num_heads: int = 9
    head_dim: int = 64
    mlp_dim: int = 1536
    num_layers: int = 30
    num_kv_heads: int = 3
    rope_theta: float = 10000.0
    rope_scaling: Any = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    init_std: float = 0.02
    param_dtype: str = "float32"
    prompt_start_id: int | None = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_prompt_start_id(self)
        name = type(self).__name__
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{name}.num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"{name}.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.param_dtype not in DTYPES:
            raise ValueError(f"{name}.param_dtype must be float32, bfloat16 or float16, got {self.param_dtype!r}")
        for field in ("rope_theta", "rms_norm_eps", "init_std"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}.{field} must be a positive number, got {value!r}")
        object.__setattr__(self, "rope_scaling", _rope_scaling(name, self.rope_scaling))

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """`rope_scaling` as transformers writes it in config.json (`rope_type` "llama3"), or None."""
        if self.rope_scaling is None:
            return None
        d: dict[str, Any] = {"rope_type": "llama3", **dict(self.rope_scaling)}
        d["original_max_position_embeddings"] = int(d["original_max_position_embeddings"])
        return d
