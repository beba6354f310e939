"""Multi-head dot-product attention with T5's conventions and an optional key-value cache.

T5 does not scale `q . k` by `1/sqrt(head_dim)`: the query initializer folds it in.
Masks and position biases arrive as one additive `bias` `[batch|1, heads|1, q, k]`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.layers import constrain, dense, kernel

NEG_INF = -1e10


def mask_to_bias(mask, dtype=jnp.float32):
    """A boolean mask `[b, 1, q, k]` (True = attend) as an additive bias."""
    return jnp.where(mask, 0.0, NEG_INF).astype(dtype)


def segment_mask(q_segments, k_segments):
    """`[b, 1, q, k]`: True where both positions are real (id > 0) and in the same segment."""
    same = q_segments[:, :, None] == k_segments[:, None, :]
    real = (q_segments[:, :, None] > 0) & (k_segments[:, None, :] > 0)
    return (same & real)[:, None]


def causal_mask(length: int):
    """`[1, 1, L, L]`: True where key position <= query position."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


class MultiHeadAttention(nn.Module):
    """Attention from `x_q` to `x_kv`, with kernels q/k/v `[embed, heads, kv]`, o `[heads, kv, embed]`.

    With `decode=True` self-attention keeps `cached_key`/`cached_value` `[b, max_len, heads, kv]`
    in the `cache` collection (the first call, at `init`, sizes them); cross-attention
    (`cross=True`) computes the encoder keys and values once and reuses them.
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    deterministic: bool = True
    decode: bool = False
    cross: bool = False

    @nn.compact
    def __call__(self, x_q, x_kv, bias):
        emb = x_q.shape[-1]
        h, d = self.num_heads, self.head_dim
        qk_axes = ("embed", "heads", "kv")
        wq = kernel(self, "query", (emb, h, d), qk_axes, (emb * d) ** -0.5, self.dtype)
        wk = kernel(self, "key", (emb, h, d), qk_axes, emb**-0.5, self.dtype)
        wv = kernel(self, "value", (emb, h, d), qk_axes, emb**-0.5, self.dtype)
        wo = kernel(self, "out", (h, d, emb), ("heads", "kv", "embed"), (h * d) ** -0.5, self.dtype)
        q = dense(x_q, wq)

        def project_kv():
            return dense(x_kv, wk), dense(x_kv, wv)

        if self.decode:
            k, v = self._cached_kv(project_kv)
        else:
            k, v = project_kv()
        q = constrain(q, ("batch", "length", "heads", "kv"))
        k = constrain(k, ("batch", "length", "heads", "kv"))
        v = constrain(v, ("batch", "length", "heads", "kv"))

        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        if bias is not None:
            logits = logits + bias.astype(jnp.float32)
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=self.deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        out = constrain(out, ("batch", "length", "heads", "kv"))
        return dense(out, wo, 2)

    def _cached_kv(self, project_kv):
        initialized = self.has_variable("cache", "cached_key")
        if not initialized:
            k, v = project_kv()
            self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
            self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
            self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            return k, v
        cached_key = self.variable("cache", "cached_key")
        cached_value = self.variable("cache", "cached_value")
        index = self.variable("cache", "cache_index")
        if self.cross:
            # Encoder keys/values: computed on the first step, reused afterwards.
            k, v = jax.lax.cond(index.value == 0, project_kv, lambda: (cached_key.value, cached_value.value))
            cached_key.value, cached_value.value = k, v
            index.value = jnp.array(1, jnp.int32)
            return k, v
        k_new, v_new = project_kv()
        start = index.value
        k = jax.lax.dynamic_update_slice(cached_key.value, k_new.astype(cached_key.value.dtype), (0, start, 0, 0))
        v = jax.lax.dynamic_update_slice(cached_value.value, v_new.astype(cached_value.value.dtype), (0, start, 0, 0))
        cached_key.value, cached_value.value = k, v
        index.value = start + k_new.shape[1]
        return k, v
