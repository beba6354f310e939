"""`EncoderDecoder`: the T5-family network in Flax Linen (pre-norm, RMS norm, relative position bias).

Parameter names follow t5x: `token_embedder`, `encoder/{relpos_bias,layers_i,encoder_norm}`,
`decoder/{relpos_bias,layers_i,decoder_norm,logits}`; one relative position table per stack,
shared by its layers. Packed examples are kept apart by `*_segment_ids` (0 = padding).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from cairn.models.attention import AttentionBias, MultiHeadAttention, causal_mask, mask_to_bias, segment_mask
from cairn.models.chunked_loss import Unembedding
from cairn.models.layers import Embed, RMSNorm, constrain, dense, kernel
from cairn.models.mlp import t5_mlp
from cairn.models.relative_position import RelativePositionBias
from cairn.models.stacking import apply_layers
from cairn.models.t5.config import T5Config

ACT = ("batch", "length", "embed")


def _dtype(config) -> jnp.dtype:
    return jnp.dtype(config.dtype)


def _param_dtype(config) -> jnp.dtype:
    return jnp.dtype(config.param_dtype)


def _attention(cfg: T5Config, deterministic: bool, decode: bool = False, cross: bool = False, *, name: str):
    """A layer's `MultiHeadAttention` as the config sets it up."""
    return MultiHeadAttention(
        cfg.num_heads,
        cfg.head_dim,
        cfg.dropout_rate,
        _dtype(cfg),
        deterministic,
        decode,
        cross,
        implementation=cfg.attention_implementation,
        float32_logits=cfg.float32_attention_logits,
        name=name,
    )


class EncoderLayer(nn.Module):
    """Self-attention then MLP, each pre-normed with a residual connection."""

    config: T5Config
    deterministic: bool = True
    scanned: bool = False
    sparse: bool = False

    @nn.compact
    def __call__(self, x, bias):
        cfg, dt = self.config, _dtype(self.config)
        drop = lambda y: nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(y, deterministic=self.deterministic)
        y = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="pre_attention_layer_norm")(x)
        y = _attention(cfg, self.deterministic, name="attention")(y, y, bias)
        x = constrain(x + drop(y), ACT)
        y = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="pre_mlp_layer_norm")(x)
        y = t5_mlp(cfg, self.sparse, self.deterministic)(y)
        x = constrain(x + drop(y), ACT)
        return (x, None) if self.scanned else x


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder (unless `cross=False`), MLP."""

    config: T5Config
    deterministic: bool = True
    decode: bool = False
    cross: bool = True
    scanned: bool = False
    sparse: bool = False

    @nn.compact
    def __call__(self, x, encoded, self_bias, cross_bias):
        cfg, dt = self.config, _dtype(self.config)
        drop = lambda y: nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(y, deterministic=self.deterministic)
        y = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="pre_self_attention_layer_norm")(x)
        y = _attention(cfg, self.deterministic, self.decode, name="self_attention")(y, y, self_bias)
        x = constrain(x + drop(y), ACT)
        if self.cross:
            y = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="pre_cross_attention_layer_norm")(x)
            attention = _attention(cfg, self.deterministic, self.decode, cross=True, name="encoder_decoder_attention")
            y = attention(y, encoded, cross_bias)
            x = constrain(x + drop(y), ACT)
        y = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="pre_mlp_layer_norm")(x)
        y = t5_mlp(cfg, self.sparse, self.deterministic)(y)
        x = constrain(x + drop(y), ACT)
        return (x, None) if self.scanned else x


class Encoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, tokens, segment_ids, deterministic: bool = True):
        cfg, dt = self.config, _dtype(self.config)
        x = self.shared_embedding(tokens.astype(jnp.int32))
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ACT)
        pos = jnp.arange(tokens.shape[1])
        bias = RelativePositionBias(
            cfg.num_heads,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
            True,
            dt,
            nn.initializers.normal(cfg.emb_dim**-0.5),
            _param_dtype(cfg),
            name="relpos_bias",
        )(pos, pos)
        dense_bias = bias + mask_to_bias(segment_mask(segment_ids, segment_ids), dt)
        bias = AttentionBias(dense_bias, bias, segment_ids, segment_ids, causal=False)
        x = apply_layers(
            EncoderLayer,
            cfg.num_encoder_layers,
            cfg.scan_layers,
            cfg.remat_policy,
            dict(config=cfg, deterministic=deterministic),
            x,
            bias,
            sparse=None if cfg.moe is None else cfg.moe.is_sparse,
        )
        x = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="encoder_norm")(x)
        return nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


def decoder_positions_and_mask(module: nn.Module, length: int, decode: bool):
    """Query/key positions and the causal mask; in decode mode, the cached step's positions."""
    if decode:
        initialized = module.has_variable("cache", "position")
        position = module.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
        # Only its shape matters (the cache length), so a cache of zeros is a valid cache.
        marker = module.variable("cache", "length_marker", lambda: jnp.zeros((length,), jnp.int32))
        if initialized:
            q_pos = position.value + jnp.arange(length, dtype=jnp.int32)
            position.value = position.value + length
            k_pos = jnp.arange(marker.value.shape[0], dtype=jnp.int32)
            return q_pos, k_pos, (k_pos[None, :] <= q_pos[:, None])[None, None]
    pos = jnp.arange(length, dtype=jnp.int32)
    return pos, pos, causal_mask(length)


class Decoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(
        self,
        encoded,
        tokens,
        encoder_segment_ids,
        decoder_segment_ids,
        deterministic: bool = True,
        decode: bool = False,
        return_hidden: bool = False,
    ):
        cfg, dt = self.config, _dtype(self.config)
        x = self.shared_embedding(tokens.astype(jnp.int32))
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        x = constrain(x, ACT)
        q_pos, k_pos, causal = decoder_positions_and_mask(self, tokens.shape[1], decode)
        self_bias = RelativePositionBias(
            cfg.num_heads,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
            False,
            dt,
            nn.initializers.normal(cfg.emb_dim**-0.5),
            _param_dtype(cfg),
            name="relpos_bias",
        )(q_pos, k_pos)
        if decoder_segment_ids is None:
            self_mask = causal
            decoder_segment_ids = jnp.ones(tokens.shape, jnp.int32)
        else:
            self_mask = causal & segment_mask(decoder_segment_ids, decoder_segment_ids)
        dense_self = self_bias + mask_to_bias(self_mask, dt)
        dense_cross = mask_to_bias(segment_mask(decoder_segment_ids, encoder_segment_ids), dt)
        if decode:  # cached steps take XLA's path
            self_bias, cross_bias = dense_self, dense_cross
        else:
            self_bias = AttentionBias(dense_self, self_bias, decoder_segment_ids, decoder_segment_ids, causal=True)
            cross_bias = AttentionBias(dense_cross, None, decoder_segment_ids, encoder_segment_ids)
        x = apply_layers(
            DecoderLayer,
            cfg.num_decoder_layers,
            cfg.scan_layers,
            cfg.remat_policy,
            dict(config=cfg, deterministic=deterministic, decode=decode),
            x,
            encoded,
            self_bias,
            cross_bias,
            sparse=None if cfg.moe is None else cfg.moe.is_sparse,
        )
        x = RMSNorm(cfg.layer_norm_epsilon, dt, _param_dtype(cfg), name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)
        if cfg.logits_via_embedding:
            x = x * (cfg.emb_dim**-0.5) if cfg.scale_tied_logits else x
            if return_hidden:
                return Unembedding(constrain(x, ACT), self.shared_embedding.table(), tied=True)
            logits = self.shared_embedding.attend(x)
        else:
            shape, pdt = (cfg.emb_dim, cfg.vocab_size), _param_dtype(cfg)
            w = kernel(self, "logits", shape, ("embed", "vocab"), cfg.emb_dim**-0.5, dt, pdt)
            if return_hidden:
                return Unembedding(constrain(x, ACT), w, tied=False)
            logits = dense(x, w)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class EncoderDecoder(nn.Module):
    """The T5 encoder-decoder. `__call__` returns float32 logits `[batch, target_len, vocab]`
    (`return_hidden=True`: a `chunked_loss.Unembedding`, the decoder's final hidden states and
    output projection, for the chunked loss). Parameters are stored as `config.param_dtype`."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = Embed(
            cfg.vocab_size, cfg.emb_dim, _dtype(cfg), param_dtype=_param_dtype(cfg), name="token_embedder"
        )
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, deterministic: bool = True):
        """Encoder outputs `[batch, input_len, emb]`."""
        if encoder_segment_ids is None:
            encoder_segment_ids = (encoder_input_tokens > 0).astype(jnp.int32)
        return self.encoder(encoder_input_tokens, encoder_segment_ids, deterministic)

    def decode(
        self,
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        encoder_segment_ids=None,
        decoder_segment_ids=None,
        deterministic: bool = True,
        decode: bool = False,
        return_hidden: bool = False,
    ):
        """Logits for `decoder_input_tokens` given the encoder outputs (one step when `decode`);
        with `return_hidden`, the decoder's `chunked_loss.Unembedding` instead."""
        if encoder_segment_ids is None:
            encoder_segment_ids = (encoder_input_tokens > 0).astype(jnp.int32)
        return self.decoder(
            encoded,
            decoder_input_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            deterministic,
            decode,
            return_hidden,
        )

    def __call__(
        self,
        encoder_input_tokens,
        decoder_input_tokens,
        encoder_segment_ids=None,
        decoder_segment_ids=None,
        deterministic: bool = True,
        decode: bool = False,
        return_hidden: bool = False,
    ):
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, deterministic)
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            deterministic,
            decode,
            return_hidden,
        )
