"""`gpt.Decoder`: a GPT-style decoder (T5 layers without cross-attention), with
optional prefix-LM attention (bidirectional over the inputs, causal over the targets)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from cairn.models.attention import AttentionBias, causal_mask, mask_to_bias, segment_mask
from cairn.models.chunked_loss import Unembedding
from cairn.models.decode_cache import chunk_positions_and_mask
from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.layers import Embed, RMSNorm, constrain, kernel
from cairn.models.relative_position import RelativePositionBias
from cairn.models.stacking import apply_layers
from cairn.models.t5.network import ACT, DecoderLayer


class Decoder(nn.Module):
    """Returns float32 logits `[batch, length, vocab]` for `decoder_input_tokens`.

    `decoder_causal_attention` (1 on input positions) makes attention among the inputs
    bidirectional (prefix LM); `decoder_segment_ids` separates packed sequences.
    `decoder_positions` is accepted for the signature the decoder-only networks share and not
    needed: relative position biases depend on position differences only, which packing keeps.

    `decode=True` follows `decode_cache`'s contract: a sizing call, then chunks `[b, n]` whose
    `decoder_segment_ids` mark padded keys (0) and whose `decoder_causal_attention` makes the
    chunk's prompt positions attend each other (a prefix LM's prefill). Positions are
    relative, so a left-padded prompt with its padding masked gives the unpadded logits.

    `return_hidden=True` returns a `chunked_loss.Unembedding` (final hidden states and output
    projection) instead of logits, for the chunked loss. Parameters are stored as
    `config.param_dtype`.
    """

    config: DecoderOnlyConfig

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
        del decoder_positions
        cfg = self.config
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        embed = Embed(cfg.vocab_size, cfg.emb_dim, dt, param_dtype=pdt, name="token_embedder")
        tokens = decoder_input_tokens.astype(jnp.int32)
        x = embed(tokens)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ACT)
        chunk = (
            chunk_positions_and_mask(self, tokens.shape, decoder_segment_ids, decoder_causal_attention)
            if decode
            else None
        )
        if chunk is None:  # a full forward, or decode mode's sizing call
            q_pos = k_pos = jnp.arange(tokens.shape[1], dtype=jnp.int32)
            mask = causal_mask(tokens.shape[1])
            if decoder_causal_attention is not None:
                prefix = decoder_causal_attention > 0
                mask = mask | (prefix[:, :, None] & prefix[:, None, :])[:, None]
            full_mask = mask  # before packing
            if decoder_segment_ids is not None:
                mask = mask & segment_mask(decoder_segment_ids, decoder_segment_ids)
        else:
            q_pos, k_pos, mask = chunk
        bias = RelativePositionBias(
            cfg.num_heads,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
            False,
            dt,
            nn.initializers.normal(cfg.emb_dim**-0.5),
            pdt,
            name="relpos_bias",
        )(q_pos, k_pos)
        dense_bias = bias + mask_to_bias(mask, dt)
        if not decode:
            # The kernel's parts: a prefix LM's bidirectional block joins the position bias
            # (then per row, `[b, heads, l, l]`); packing stays segment ids.
            causal = decoder_causal_attention is None
            if not causal:
                bias = bias + mask_to_bias(full_mask, dt)
            segments = decoder_segment_ids
            if segments is None:
                segments = jnp.ones(tokens.shape, jnp.int32)
            bias = AttentionBias(dense_bias, bias, segments, segments, causal=causal)
        else:
            bias = dense_bias
        x = apply_layers(
            DecoderLayer,
            cfg.num_layers,
            cfg.scan_layers,
            cfg.remat_policy,
            dict(config=cfg, deterministic=deterministic, decode=decode, cross=False),
            x,
            None,
            bias,
            None,
            sparse=None if cfg.moe is None else cfg.moe.is_sparse,
        )
        x = RMSNorm(cfg.layer_norm_epsilon, dt, pdt, name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        if cfg.logits_via_embedding:
            x = x * (cfg.emb_dim**-0.5) if cfg.scale_tied_logits else x
            if return_hidden:
                return Unembedding(constrain(x, ACT), embed.table(), tied=True)
            logits = embed.attend(x)
        else:
            w = kernel(self, "logits", (cfg.emb_dim, cfg.vocab_size), ("embed", "vocab"), cfg.emb_dim**-0.5, dt, pdt)
            if return_hidden:
                return Unembedding(constrain(x, ACT), w, tied=False)
            logits = jnp.einsum("ble,ev->blv", x, w)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
