"""`Llama`: the Llama decoder in Flax Linen (RMSNorm pre-norm, RoPE, grouped-query attention,
SwiGLU MLP, no biases, tied or untied embeddings).

Parameters: `token_embedder/embedding [vocab, embed]`; per layer (`layers_{i}`, or one `layers`
subtree stacked on a leading `layers` axis with `scan_layers`) `pre_attention_norm/scale`,
`attention/{query,key,value,out}/kernel`, `pre_mlp_norm/scale`, `mlp/wi_0/kernel` (gate, SiLU),
`mlp/wi_1/kernel` (up), `mlp/wo/kernel` (with `moe`: the routed MLP of `cairn.models.moe`, its
kernels `[experts, ...]` and `mlp/router/kernel`); `decoder_norm/scale`; `logits/kernel [embed, vocab]`
only when `tie_word_embeddings` is False.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.attention import segment_mask
from cairn.models.chunked_loss import Unembedding
from cairn.models.layers import MLP_WI, MLP_WO, Embed, Kernel, RMSNorm, constrain, dense, named
from cairn.models.llama.attention import LlamaAttention
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.rope import config_rope_tables
from cairn.models.mlp import routed_mlp
from cairn.models.stacking import apply_layers

ACT = ("batch", "length", "embed")


def _dtypes(cfg: LlamaConfig) -> tuple[jnp.dtype, jnp.dtype]:
    return jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)


class SwiGLU(nn.Module):
    """`(silu(x Wi0) * (x Wi1)) Wo`."""

    config: LlamaConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dt, pdt = _dtypes(cfg)
        e, m, std = cfg.emb_dim, cfg.mlp_dim, cfg.init_std
        gate = Kernel((e, m), ("embed", "mlp"), std, dt, pdt, fp8=True, name="wi_0")()
        up = Kernel((e, m), ("embed", "mlp"), std, dt, pdt, fp8=True, name="wi_1")()
        down = Kernel((m, e), ("mlp", "embed"), std, dt, pdt, fp8=True, name="wo")()
        h = jax.nn.silu(named(dense(x, gate), MLP_WI)) * named(dense(x, up), MLP_WI)
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(h, deterministic=self.deterministic)
        return named(dense(h, down), MLP_WO)


class LlamaLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection."""

    config: LlamaConfig
    deterministic: bool = True
    decode: bool = False
    causal: bool = True
    scanned: bool = False
    sparse: bool = False

    @nn.compact
    def __call__(self, x, positions, mask, segment_ids):
        cfg = self.config
        dt, pdt = _dtypes(cfg)
        drop = lambda y: nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(y, deterministic=self.deterministic)
        y = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="pre_attention_norm")(x)
        y = LlamaAttention(cfg, self.causal, self.decode, name="attention")(y, positions, mask, segment_ids)
        x = constrain(x + drop(y), ACT)
        y = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="pre_mlp_norm")(x)
        y = self._mlp(y)
        x = constrain(x + drop(y), ACT)
        return (x, None) if self.scanned else x

    def _mlp(self, y):
        cfg = self.config
        if not self.sparse:
            return SwiGLU(cfg, self.deterministic, name="mlp")(y)
        dt, pdt = _dtypes(cfg)
        std = cfg.init_std
        return routed_mlp()(
            cfg.moe,
            cfg.moe.mlp_dim(cfg.mlp_dim),
            ("silu", "linear"),
            std,
            std,
            std,
            cfg.dropout_rate,
            dt,
            pdt,
            self.deterministic,
            name="mlp",
        )(y)


def attention_mask(segment_ids, causal_attention, length: int):
    """`(mask [b|1, 1, l, l] bool or None, causal)` for a training/scoring pass.

    Plain causal LM: no mask (`causal` True: `dot_product_attention` adds it). Packed rows
    (`segment_ids`, 0 = padding): the segment mask, causal True. Prefix LM
    (`causal_attention`, 1 on input positions): causal or both in the prefix, explicitly.
    """
    mask = None
    if segment_ids is not None:
        mask = segment_mask(segment_ids, segment_ids)
    if causal_attention is None:
        return mask, True
    idx = jnp.arange(length)
    prefix = causal_attention > 0
    full = (idx[None, :] <= idx[:, None])[None, None] | (prefix[:, :, None] & prefix[:, None, :])[:, None]
    return (full if mask is None else full & mask), False


class Llama(nn.Module):
    """Returns float32 logits `[batch, length, vocab]` for `decoder_input_tokens`.

    The call signature is `gpt.Decoder`'s: `decoder_segment_ids` keeps packed
    sequences apart (0 = padding), `decoder_causal_attention` (1 on input positions) makes
    attention over the prefix bidirectional, `decoder_positions` are the RoPE positions
    (restarting per packed segment; default `0..l-1`, or the cache positions when decoding).
    With `decode=True` it follows the cache contract in `llama.attention`; `return_hidden=True`
    returns a `chunked_loss.Unembedding` (final hidden states and output projection) instead of
    logits, for the chunked loss.
    """

    config: LlamaConfig

    @nn.compact
    def __call__(
        self,
        decoder_input_tokens,
        decoder_segment_ids=None,
        decoder_causal_attention=None,
        deterministic: bool = True,
        decode: bool = False,
        decoder_positions=None,
        return_hidden: bool = False,
    ):
        cfg = self.config
        dt, pdt = _dtypes(cfg)
        embed = Embed(cfg.vocab_size, cfg.emb_dim, dt, nn.initializers.normal(cfg.init_std), pdt, name="token_embedder")
        tokens = decoder_input_tokens.astype(jnp.int32)
        x = constrain(embed(tokens), ACT)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        if decode:
            # The layers build the cache mask (not used by the sizing call); a prefix LM's
            # prompt positions (`decoder_causal_attention`) reach them as `mask`.
            mask, causal = decoder_causal_attention, True
        else:
            mask, causal = attention_mask(decoder_segment_ids, decoder_causal_attention, tokens.shape[1])
        positions = None if decoder_positions is None else decoder_positions.astype(jnp.int32)
        if positions is None and not decode:
            positions = tokens.shape[1]  # 0..l-1
        if positions is not None:  # RoPE's cos/sin once for all layers (decode steps: per layer)
            positions = config_rope_tables(cfg, positions)
        # Decoding: the cache's key mask; otherwise the packing the splash kernel needs.
        segments = decoder_segment_ids
        x = apply_layers(
            LlamaLayer,
            cfg.num_layers,
            cfg.scan_layers,
            cfg.remat_policy,
            dict(config=cfg, deterministic=deterministic, decode=decode, causal=causal),
            x,
            positions,
            mask,
            segments,
            sparse=None if cfg.moe is None else cfg.moe.is_sparse,
        )
        x = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        if cfg.tie_word_embeddings:
            if return_hidden:
                return Unembedding(constrain(x, ACT), embed.table(), tied=True)
            logits = embed.attend(x, preferred_element_type=jnp.float32)
        else:  # one 2-D matmul over the flattened tokens, as `attend_table` (its docstring says why)
            w = Kernel((cfg.emb_dim, cfg.vocab_size), ("embed", "vocab"), cfg.init_std, dt, pdt, name="logits")()
            if return_hidden:
                return Unembedding(constrain(x, ACT), w, tied=False)
            flat = jnp.einsum("te,ev->tv", x.reshape(-1, cfg.emb_dim), w, preferred_element_type=jnp.float32)
            logits = flat.reshape(*x.shape[:-1], cfg.vocab_size)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
