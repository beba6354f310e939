"""Model FLOPs of a training step (the numerator of MFU).

For an encoder-decoder with input length `Li` and target length `Lt`, per example:

    6 * (sum over non-embedding matmul kernels of params * tokens it acts on)
      + 6 * emb * vocab * Lt                                  (output logits)
      + 12 * heads * head_dim * (enc_layers * Li**2 + dec_layers * (Lt**2 + Lt * Li))   (q.k and p.v)

Encoder kernels act on `Li` tokens; decoder self-attention, the cross-attention query and
output, and the MLP on `Lt`; the cross-attention key and value on `Li`. The factor 6 is 2
(multiply-add) x 3 (forward, and the two backward matmuls). Embedding lookups are free;
norms, softmax and elementwise ops are not counted. A decoder-only model has `Li = 0`.
"""

from __future__ import annotations

from collections.abc import Mapping

from cairn.models.decoder_only import DecoderOnlyConfig
from cairn.models.t5.config import T5Config


def _attention_params(c) -> int:
    return 4 * c.emb_dim * c.num_heads * c.head_dim


def _mlp_params(c) -> int:
    return (len(c.mlp_activations) + 1) * c.emb_dim * c.mlp_dim


def training_flops_per_example(config: T5Config | DecoderOnlyConfig, lengths: Mapping[str, int]) -> float:
    """Training FLOPs (forward + backward) for one example; `lengths` has `inputs` and `targets`
    (decoder-only: `targets` only)."""
    c = config
    if not isinstance(c, (T5Config, DecoderOnlyConfig)):
        raise TypeError(f"expected a T5Config or DecoderOnlyConfig, got {type(c).__name__}")
    lt = int(lengths["targets"])
    hd = c.num_heads * c.head_dim
    logits = 6.0 * c.emb_dim * c.vocab_size * lt
    if isinstance(c, DecoderOnlyConfig):
        dense = c.num_layers * (_attention_params(c) + _mlp_params(c)) * lt
        attention = 12.0 * hd * c.num_layers * lt * lt
        return 6.0 * dense + logits + attention
    li = int(lengths["inputs"])
    enc = c.num_encoder_layers * (_attention_params(c) + _mlp_params(c)) * li
    half_attn = _attention_params(c) // 2
    dec = c.num_decoder_layers * ((_attention_params(c) + half_attn + _mlp_params(c)) * lt + half_attn * li)
    attention = 12.0 * hd * (c.num_encoder_layers * li * li + c.num_decoder_layers * (lt * lt + lt * li))
    return 6.0 * (enc + dec) + logits + attention


def training_flops_per_step(config, batch_size: int, lengths: Mapping[str, int]) -> float:
    """`batch_size * training_flops_per_example`."""
    return batch_size * training_flops_per_example(config, lengths)


def flops_per_token(config: T5Config | DecoderOnlyConfig, lengths: Mapping[str, int]) -> float:
    """Training FLOPs per target token: `training_flops_per_example / lengths['targets']`."""
    return training_flops_per_example(config, lengths) / int(lengths["targets"])
