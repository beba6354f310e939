"""Model FLOPs of a training step (the numerator of MFU).

For an encoder-decoder with input length `Li` and target length `Lt`, per example:

    6 * (sum over non-embedding matmul kernels of params * tokens it acts on)
      + 6 * emb * vocab * Lt                                  (output logits)
      + 12 * heads * head_dim * (enc_layers * Li**2 + dec_layers * (Lt**2 + Lt * Li))   (q.k and p.v)

Encoder kernels act on `Li` tokens; decoder self-attention, the cross-attention query and
output, and the MLP on `Lt`; the cross-attention key and value on `Li`. The factor 6 is 2
(multiply-add) x 3 (forward, and the two backward matmuls). Embedding lookups are free;
norms, softmax, RoPE and elementwise ops are not counted. A decoder-only model has `Li = 0`.

Llama: the query and output kernels are `emb * heads * head_dim` each, the key and value
kernels `emb * kv_heads * head_dim` each (grouped-query attention), the SwiGLU MLP three
`emb * mlp` kernels; q.k and p.v still cost `12 * heads * head_dim * Lt**2` per layer (every
query head attends, whatever the number of key/value heads); tied logits cost the same matmul.
As in t5x, the causal mask's skipped half is counted.

Mixture of experts (`config.moe`, every family): the FLOPs a token actually uses (active
FLOPs, so MFU compares like with like against a dense model). A routed layer's MLP counts the
router matmul (`emb * num_experts` parameters) plus `moe.active_experts()` expert MLPs of
`moe.mlp_dim(mlp_dim)` hidden units (token choice: `top_k`; expert choice: `capacity_factor`,
every expert when dropless) in place of the dense MLP. These are model FLOPs, not what the
hardware runs: assignments dropped for capacity are still counted, the empty slots of the
expert buffers (computed whether full or not: `capacity_factor` times the routed tokens) and
the one-hot dispatch and combine einsums are not (routing overhead, like the softmax).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cairn.models.families import family_of
from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.llama.config import LlamaConfig
from cairn.models.t5.config import T5Config

Config = T5Config | DecoderOnlyConfig | LlamaConfig


def _attention_params(c) -> int:
    return 4 * c.emb_dim * c.num_heads * c.head_dim


def _mlp_kernels(c) -> int:
    """The `emb x mlp` kernels of one MLP: SwiGLU's three, a T5 MLP's activations plus `wo`."""
    return 3 if isinstance(c, LlamaConfig) else len(c.mlp_activations) + 1


def mlp_params(c: Config, layer: int) -> float:
    """The matmul parameters a token uses in layer `layer`'s MLP: the dense MLP's, or a routed
    layer's router plus `moe.active_experts()` experts'."""
    moe = c.moe
    if moe is None or not moe.is_sparse(layer):
        return _mlp_kernels(c) * c.emb_dim * c.mlp_dim
    expert = _mlp_kernels(c) * c.emb_dim * moe.mlp_dim(c.mlp_dim)
    return c.emb_dim * moe.num_experts + moe.active_experts() * expert


def _sum_layers(num_layers: int, per_layer: Callable[[int], float]) -> float:
    return sum(per_layer(i) for i in range(num_layers))


def llama_layer_params(c: LlamaConfig, layer: int = 0) -> float:
    """The matmul parameters a token uses in Llama layer `layer` (attention with GQA, SwiGLU
    or routed SwiGLU experts)."""
    attention = 2 * c.emb_dim * c.head_dim * (c.num_heads + c.num_kv_heads)
    return attention + mlp_params(c, layer)


def llama_flops(c: LlamaConfig, lengths: Mapping[str, int]) -> float:
    """Training FLOPs of one example of a Llama (module docstring): `targets` tokens."""
    lt = int(lengths["targets"])
    dense = _sum_layers(c.num_layers, lambda i: llama_layer_params(c, i)) * lt
    return 6.0 * dense + _logits(c, lt) + 12.0 * c.num_heads * c.head_dim * c.num_layers * lt * lt


def decoder_flops(c: DecoderOnlyConfig, lengths: Mapping[str, int]) -> float:
    """Training FLOPs of one example of the GPT-style decoder: `targets` tokens."""
    lt = int(lengths["targets"])
    dense = _sum_layers(c.num_layers, lambda i: _attention_params(c) + mlp_params(c, i)) * lt
    return 6.0 * dense + _logits(c, lt) + 12.0 * c.num_heads * c.head_dim * c.num_layers * lt * lt


def encoder_decoder_flops(c: T5Config, lengths: Mapping[str, int]) -> float:
    """Training FLOPs of one example of a T5 encoder-decoder: `inputs` and `targets` tokens."""
    lt, li = int(lengths["targets"]), int(lengths["inputs"])
    attn = _attention_params(c)
    enc = _sum_layers(c.num_encoder_layers, lambda i: attn + mlp_params(c, i)) * li
    half_attn = attn // 2
    dec = _sum_layers(c.num_decoder_layers, lambda i: (attn + half_attn + mlp_params(c, i)) * lt + half_attn * li)
    hd = c.num_heads * c.head_dim
    attention = 12.0 * hd * (c.num_encoder_layers * li * li + c.num_decoder_layers * (lt * lt + lt * li))
    return 6.0 * (enc + dec) + _logits(c, lt) + attention


def _logits(c: Config, lt: int) -> float:
    return 6.0 * c.emb_dim * c.vocab_size * lt


def training_flops_per_example(config: Config, lengths: Mapping[str, int]) -> float:
    """Training FLOPs (forward + backward) for one example; `lengths` has `inputs` and `targets`
    (decoder-only and Llama: `targets` only). Active FLOPs for a mixture of experts. The
    formula is the config's family's (`ModelFamily.training_flops`); TypeError for a config of
    no registered family, or of one that declares none."""
    family = family_of(config)  # TypeError for a config of no registered family
    if family.training_flops is None:
        raise TypeError(f"model family {family.name!r} declares no training FLOPs")
    return family.training_flops(config, lengths)


def training_flops_per_step(config, batch_size: int, lengths: Mapping[str, int]) -> float:
    """`batch_size * training_flops_per_example`."""
    return batch_size * training_flops_per_example(config, lengths)


def flops_per_token(config: Config, lengths: Mapping[str, int]) -> float:
    """Training FLOPs per target token: `training_flops_per_example / lengths['targets']`."""
    return training_flops_per_example(config, lengths) / int(lengths["targets"])
