"""T5Config: the hyperparameters of a T5-family encoder-decoder (T5.1.0, T5.1.1, mT5, ByT5, UL2)."""

from __future__ import annotations

import dataclasses
from typing import Tuple

REMAT_POLICIES = ("none", "full", "dots")
ACTIVATIONS = ("relu", "gelu", "silu", "linear")


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyperparameters of `t5.EncoderDecoder`.

    `mlp_activations` has one entry for a plain MLP (`("relu",)`, T5.1.0) and two for a
    gated one (`("gelu", "linear")`, T5.1.1: `gelu(x W0) * (x W1)`). `logits_via_embedding`
    ties the output layer to the token embedding and rescales the decoder output by
    `emb_dim ** -0.5` (T5.1.0); otherwise a separate `logits` kernel is used (T5.1.1).
    """

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    head_dim: int = 64
    mlp_dim: int = 1024
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    mlp_activations: Tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"

    def __post_init__(self):
        for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                     "num_encoder_layers", "num_decoder_layers", "relative_attention_num_buckets"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"T5Config.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        if len(self.mlp_activations) not in (1, 2) or any(a not in ACTIVATIONS for a in self.mlp_activations):
            raise ValueError(f"T5Config.mlp_activations must be 1 or 2 of {ACTIVATIONS}, got {self.mlp_activations!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"T5Config.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"T5Config.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    def replace(self, **changes) -> "T5Config":
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)
