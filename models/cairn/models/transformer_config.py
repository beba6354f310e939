"""`ModelConfig`: the hyperparameters every cairn network shares; `TransformerConfig`: those of
the T5-style networks (T5Config, DecoderOnlyConfig) on top of it.

A family's config adds its own fields (`LlamaConfig`: grouped-query heads, RoPE, ...) and its
layer counts (`T5Config`: `num_encoder_layers`, `num_decoder_layers`; `DecoderOnlyConfig` and
`LlamaConfig`: `num_layers`), naming them in `LAYER_FIELDS`, so the shared fields are declared,
documented and validated once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from cairn.models.moe_config import MoeConfig, as_moe_config

REMAT_POLICIES = (
    "none",
    "full",
    "dots",
    "dots_except_mlp_wi",
    "minimal",
    "kv_projections",
    "attention_kernel",
    "mlp_wi",
    "dots_offloaded",
    "dots_except_mlp_wi_offloaded",
    "minimal_offloaded",
)
ACTIVATIONS = ("relu", "gelu", "silu", "linear")
DTYPES = ("float32", "bfloat16", "float16")
# "default": the projections multiply in `dtype`; "fp8": in fp8 with delayed scaling (`cairn.models.fp8`).
MATMUL_PRECISIONS = ("default", "fp8")
# Shared fields that must be positive ints (a family adds its `LAYER_FIELDS`).
POSITIVE_FIELDS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim")

C = TypeVar("C", bound="ModelConfig")

# The presets' loss: every preset of a real size (not the toy `*_tiny` ones, whose runs swap in
# a small vocabulary) with `CHUNKED_LOSS_MIN_VOCAB` words or more computes its training loss in
# chunks of `PRESET_LOSS_CHUNK_SIZE` tokens (`loss_chunk_size`; llama_1b's TPU runs used 4096:
# a chunk's float32 logits are 2.1 GB at 128,256 words, 0.5 GB at 32,128).
PRESET_LOSS_CHUNK_SIZE = 4096
CHUNKED_LOSS_MIN_VOCAB = 32000


def preset_loss_chunk_size(vocab_size: int) -> int:
    """A full-size preset's `loss_chunk_size`: `PRESET_LOSS_CHUNK_SIZE` for a vocabulary of
    `CHUNKED_LOSS_MIN_VOCAB` words or more, else 0 (whole logits)."""
    return PRESET_LOSS_CHUNK_SIZE if vocab_size >= CHUNKED_LOSS_MIN_VOCAB else 0


def check_prompt_start_id(config: Any) -> None:
    """Validates a decoder-only config's `prompt_start_id`: the token `predict_batch` puts in
    front of every prompt (0: T5's decoder start, Cairn's default; an imported checkpoint's
    `bos_token_id`), or None (nothing: the prompt already begins with it, as a tokenizer that
    adds BOS gives it). An id must lie in `[0, vocab_size)`."""
    value = config.prompt_start_id
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < config.vocab_size)
    if not ok:
        raise ValueError(
            f"{type(config).__name__}.prompt_start_id must be None or a token id in [0, {config.vocab_size}), "
            f"got {value!r}"
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields of every family's config (validated on creation).

    `scan_layers` stacks the layers under `jax.lax.scan`; `remat_policy` is one of
    `REMAT_POLICIES`; `dtype` (the activations' and matmuls' dtype) one of `DTYPES`;
    `param_dtype` (one of `DTYPES`) the dtype parameters are stored in (cast to `dtype` where
    they are used; softmax, norms, logits and the loss are float32 either way).
    `loss_chunk_size`: 0 computes the training loss from the whole float32 logits `[b, l,
    vocab]`; a positive value computes it from the final hidden states in chunks of about that
    many tokens (`cairn.models.chunked_loss`: the same loss, metrics and gradients, one chunk's
    logits in memory at a time); the full-size presets of large vocabularies take
    `preset_loss_chunk_size`.
    `moe`: None (dense MLPs) or a `MoeConfig` (or a mapping of its fields) making every
    `moe.every`-th MLP a routed mixture of experts; `moe.every > 1` needs `scan_layers` off
    (scanned layers must be identical). `attention_implementation`: one of
    `ATTENTION_IMPLEMENTATIONS` (`cairn.models.pallas_attention`, `cairn.models.gpu_attention`:
    None = the Pallas kernel on TPU and cuDNN's fused attention on GPU for every attention they
    support, XLA's einsum otherwise; "xla"; "pallas" = always the kernel, interpreted off the
    TPU; "cudnn" = always cuDNN's; a `ValueError` where the forced one cannot run).
    `matmul_precision`: one of `MATMUL_PRECISIONS`; "fp8" multiplies the attention's query, key,
    value and output projections and the dense MLPs' kernels in fp8 (e4m3 inputs and kernels,
    e5m2 output gradients, delayed per-tensor scaling: `cairn.models.fp8`); the embedding, the
    logits, attention's own einsums and routed experts stay in `dtype`.
    """

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ()
    # Fields (besides `POSITIVE_FIELDS` and `LAYER_FIELDS`) that must be positive ints.
    EXTRA_POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ()
    # The values `attention_implementation` may take (a family may add its own).
    ATTENTION_IMPLEMENTATIONS: ClassVar[tuple[str | None, ...]] = (None, "xla", "pallas", "cudnn")

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    head_dim: int = 64
    mlp_dim: int = 1024
    dropout_rate: float = 0.0
    dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    moe: Any = None
    attention_implementation: str | None = None
    param_dtype: str = "float32"
    loss_chunk_size: int = 0
    matmul_precision: str = "default"

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "moe", as_moe_config(self.moe))
        moe: MoeConfig | None = self.moe
        if moe is not None and moe.every > 1 and self.scan_layers:
            raise ValueError(f"{name}: moe.every > 1 needs scan_layers=False (scanned layers must be identical)")
        for field in POSITIVE_FIELDS + self.EXTRA_POSITIVE_FIELDS + self.LAYER_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{field} must be a positive int, got {value!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"{name}.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"{name}.dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{name}.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.attention_implementation not in self.ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"{name}.attention_implementation must be one of {self.ATTENTION_IMPLEMENTATIONS}, "
                f"got {self.attention_implementation!r}"
            )
        if self.param_dtype not in DTYPES:
            raise ValueError(f"{name}.param_dtype must be float32, bfloat16 or float16, got {self.param_dtype!r}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"{name}.matmul_precision must be one of {MATMUL_PRECISIONS}, got {self.matmul_precision!r}"
            )
        chunk = self.loss_chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise ValueError(f"{name}.loss_chunk_size must be an int >= 0 (0: whole logits), got {chunk!r}")

    def replace(self: C, **changes) -> C:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """The fields of a T5-style transformer shared by T5Config and DecoderOnlyConfig.

    `mlp_activations` has one entry for a plain MLP (`("relu",)`, T5.1.0) and two for a
    gated one (`("gelu", "linear")`, T5.1.1: `gelu(x W0) * (x W1)`). `logits_via_embedding`
    ties the output layer to the token embedding and, with `scale_tied_logits` (default),
    rescales the decoder output by `emb_dim ** -0.5` (T5.1.0; without it the tied head is
    unscaled, as transformers 5 runs mT5); otherwise a separate `logits` kernel is used (T5.1.1).
    Relative position biases use `relative_attention_num_buckets` buckets up to
    `relative_attention_max_distance`. Parameters are stored as `param_dtype` (default
    float32); `dtype` is the compute dtype. `float32_attention_logits` (default True) computes
    XLA's attention logits, bias and softmax in float32; False keeps them in the compute `dtype`
    as t5x's T5 does by default (its `float32_attention_logits=False`): in bfloat16, half the
    memory traffic of the `[b, heads, q, k]` tensors, which bound T5's step on a TPU at 512
    tokens.
    """

    EXTRA_POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ("relative_attention_num_buckets",)

    mlp_activations: tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    scale_tied_logits: bool = True
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    float32_attention_logits: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        if len(self.mlp_activations) not in (1, 2) or any(a not in ACTIVATIONS for a in self.mlp_activations):
            raise ValueError(f"{name}.mlp_activations must be 1 or 2 of {ACTIVATIONS}, got {self.mlp_activations!r}")
