"""Multi-head dot-product attention with T5's conventions and an optional key-value cache.

T5 does not scale `q . k` by `1/sqrt(head_dim)`: the query initializer folds it in.
Masks and position biases arrive as one additive `bias` `[batch|1, heads|1, q, k]`, or as an
`AttentionBias` that also keeps their parts apart for the Pallas kernel
(`cairn.models.pallas_attention`) and cuDNN's fused attention (`cairn.models.gpu_attention`,
through `fused_attention`); `implementation` chooses, as the configs'
`attention_implementation`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from cairn.models import gpu_attention, pallas_attention
from cairn.models.layers import ATTENTION_PROJECTIONS, constrain, dense, kernel, named, project_heads

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


@struct.dataclass
class AttentionBias:
    """An attention's masks and position bias, whole and in parts.

    `dense` `[b|1, heads|1, q, k]`: everything added to the logits (XLA's path; under `jit` it
    is not computed when the kernel runs). The kernel's parts: `kernel_bias` `[b|1, heads, q, k]`
    or None (the position bias, plus a prefix LM's mask), `q_segment_ids` `[b, q]` and
    `kv_segment_ids` `[b, k]` (0 = padding; both or neither) and `causal` (static). They must
    mean the same as `dense` at every real (segment id > 0) query.
    """

    dense: jax.Array
    kernel_bias: jax.Array | None = None
    q_segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    causal: bool = struct.field(pytree_node=False, default=False)


def parts_bias(bias: AttentionBias) -> tuple[jax.Array, ...]:
    """What `bias.dense` adds to the logits, as its parts (`[1|b, heads, q, k]` position bias and a
    `[b|1, 1, q, k]` mask), each broadcast only where it is added to the logits.

    Equal to `bias.dense` wherever a key is not masked, so the softmax is the same at every real
    query. XLA's path adds these instead of the dense bias: a dense `[b, heads, q, k]` bias shared
    by a stack of layers is one more tensor of the logits' size read by every layer, and the
    gradient of the shared position bias is then summed over the batch inside each layer instead
    of carried across the stack at the logits' size (T5.1.1-large on a TPU v5e: a 29 ms select-add
    over three such tensors in a 309 ms step)."""
    parts = [] if bias.kernel_bias is None else [bias.kernel_bias]
    mask = None
    if bias.q_segment_ids is not None:
        mask = segment_mask(bias.q_segment_ids, bias.kv_segment_ids)
    if bias.causal:  # self-attention: as many keys as queries
        below = causal_mask(bias.dense.shape[-1])
        mask = below if mask is None else mask & below
    if mask is not None:
        parts.append(mask_to_bias(mask, bias.dense.dtype))
    return tuple(parts)


def fused_attention(q, k, v, bias: AttentionBias, implementation: str = gpu_attention.KERNEL) -> jax.Array:
    """`gpu_attention.attention` of `q` `[b, q, heads, d]`, `k`, `v` `[b, k, heads, d]` with
    `bias`'s parts: `kernel_bias` as the bias, the segment ids' `segment_mask` as the mask (it
    also masks padding) and `causal` as `is_causal`; no scaling (T5's). The same as `bias.dense`
    at every real query. `implementation` is `jax.nn.dot_product_attention`'s ("cudnn"; "xla"
    runs the same call anywhere)."""
    mask = None
    if bias.q_segment_ids is not None:
        mask = segment_mask(bias.q_segment_ids, bias.kv_segment_ids)
    return gpu_attention.attention(
        q, k, v, bias.kernel_bias, mask, is_causal=bias.causal, scale=1.0, implementation=implementation
    )


class MultiHeadAttention(nn.Module):
    """Attention from `x_q` to `x_kv`, with kernels q/k/v `[embed, heads, kv]`, o `[heads, kv, embed]`.

    With `decode=True` self-attention keeps `cached_key`/`cached_value` `[b, heads, max_len, kv]`
    (head-major, so that no step transposes the cache) in the `cache` collection: the first
    call sizes them (zeros). Cross-attention (`cross=True`) projects the encoder keys and values
    in that first call and stores them: later calls only read them. So the first call must
    really run (under `jit` everything else in it is dead code), not only be shape-evaluated.

    `implementation` (None, "xla", "pallas", "cudnn"; `cairn.models.pallas_attention`,
    `cairn.models.gpu_attention`): the flash kernel and cuDNN's fused attention (where the
    kernel does not run) need `bias` as an `AttentionBias`, no decode cache (decode steps
    always take XLA's path) and no attention dropout in effect. `float32_logits` (XLA's path): the logits, bias and
    softmax in float32 (default), or in the compute `dtype` as t5x computes them by default
    (`float32_attention_logits=False`: half the memory traffic of the `[b, heads, q, k]`
    tensors in bfloat16; the kernel computes in float32 either way).
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    deterministic: bool = True
    decode: bool = False
    cross: bool = False
    implementation: str | None = None
    float32_logits: bool = True

    @nn.compact
    def __call__(self, x_q, x_kv, bias):
        emb = x_q.shape[-1]
        h, d = self.num_heads, self.head_dim
        qk_axes = ("embed", "heads", "kv")
        wq = kernel(self, "query", (emb, h, d), qk_axes, (emb * d) ** -0.5, self.dtype, fp8=True)
        wk = kernel(self, "key", (emb, h, d), qk_axes, emb**-0.5, self.dtype, fp8=True)
        wv = kernel(self, "value", (emb, h, d), qk_axes, emb**-0.5, self.dtype, fp8=True)
        wo = kernel(self, "out", (h, d, emb), ("heads", "kv", "embed"), (h * d) ** -0.5, self.dtype, fp8=True)
        q_name, k_name, v_name, out_name = ATTENTION_PROJECTIONS
        q = project_heads(x_q, wq, q_name)
        if self._use_kernel(x_q.shape[1], x_kv.shape[1], bias):
            k, v = project_heads(x_kv, wk, k_name), project_heads(x_kv, wv, v_name)
            q, k, v = (constrain(a, ("batch", "length", "heads", "kv")) for a in (q, k, v))
            out = pallas_attention.flash_attention(
                q, k, v, bias.kernel_bias, bias.q_segment_ids, bias.kv_segment_ids, causal=bias.causal
            )
            out = constrain(out, ("batch", "length", "heads", "kv"))
            return named(dense(out, wo, 2), out_name)
        fused = self._fused(q, x_kv.shape[1], bias)
        if fused is not None:
            k, v = project_heads(x_kv, wk, k_name), project_heads(x_kv, wv, v_name)
            return named(dense(fused_attention(q, k, v, bias, fused), wo, 2), out_name)
        if isinstance(bias, AttentionBias):
            bias = parts_bias(bias)
        if self.decode:
            k, v = self._cached_kv(x_kv, wk, wv)
            kv = "bhkd"  # the cache's head-major layout
        else:
            k, v = project_heads(x_kv, wk, k_name), project_heads(x_kv, wv, v_name)
            q = constrain(q, ("batch", "length", "heads", "kv"))
            k = constrain(k, ("batch", "length", "heads", "kv"))
            v = constrain(v, ("batch", "length", "heads", "kv"))
            kv = "bkhd"
        # float32 logits and softmax, or (`float32_logits=False`, t5x's default) the compute dtype's
        logits_dtype = jnp.float32 if self.float32_logits else self.dtype
        logits = jnp.einsum(f"bqhd,{kv}->bhqk", q, k, preferred_element_type=logits_dtype)
        if isinstance(bias, tuple):  # the parts, added in the logits' fusion (never `[b, h, q, k]`)
            for part in bias:
                logits = logits + part.astype(logits_dtype)
        elif bias is not None:
            logits = logits + bias.astype(logits_dtype)
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=self.deterministic)
        out = jnp.einsum(f"bhqk,{kv}->bqhd", weights, v)
        out = constrain(out, ("batch", "length", "heads", "kv"))
        return named(dense(out, wo, 2), out_name)

    def _use_kernel(self, q_len: int, kv_len: int, bias) -> bool:
        """Whether this call runs the Pallas kernel (`pallas_attention.use_kernel`)."""
        # Decode steps keep XLA's path; initialising makes parameters only (any shape).
        if self.decode or self.is_initializing() or self.implementation == "xla":
            return False
        return pallas_attention.use_kernel(
            self.implementation,
            q_len,
            kv_len,
            self.head_dim,
            self._unsupported(bias),
            pallas_attention.FLASH_AUTO_MIN_LENGTH,
        )

    def _fused(self, q, kv_len: int, bias) -> str | None:
        """`gpu_attention.fused_implementation` of this call (decode mode and initialising: None)."""
        if self.decode or self.is_initializing():
            return None
        why, bias_shape = self._unsupported(bias), None
        if why is None:  # the bias cuDNN gets: the position bias plus the mask (`fused_attention`)
            parts = [] if bias.kernel_bias is None else [bias.kernel_bias.shape]
            if bias.q_segment_ids is not None:
                parts.append((q.shape[0], 1, q.shape[1], kv_len))
            bias_shape = jnp.broadcast_shapes(*parts) if parts else None
        kv_shape = (q.shape[0], kv_len, *q.shape[2:])
        return gpu_attention.fused_implementation(self.implementation, q.shape, kv_shape, q.dtype, bias_shape, why)

    def _unsupported(self, bias) -> str | None:
        """Why neither kernel can take this call whatever its shapes (None: the shapes decide)."""
        if not isinstance(bias, AttentionBias):
            return "the mask is a plain additive bias, not an AttentionBias"
        if self.dropout_rate > 0 and not self.deterministic:
            return "attention dropout is in effect (the kernel has none)"
        return None

    def _cached_kv(self, x_kv, wk, wv):
        """Keys and values `[b, heads, len, kv]` from the cache, after writing this chunk's."""

        def project():
            # Projected token-major, then the (small) results transposed: an einsum straight to
            # head-major makes XLA:CPU transpose the kernels on every step instead.
            return dense(x_kv, wk).transpose(0, 2, 1, 3), dense(x_kv, wv).transpose(0, 2, 1, 3)

        if not self.has_variable("cache", "cached_key"):  # the sizing call
            k, v = project()
            init = (lambda a: a) if self.cross else jnp.zeros_like
            self.variable("cache", "cached_key", init, k)
            self.variable("cache", "cached_value", init, v)
            if not self.cross:
                self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            return k, v
        cached_key = self.variable("cache", "cached_key")
        cached_value = self.variable("cache", "cached_value")
        if self.cross:  # the encoder's keys and values, projected by the sizing call
            return cached_key.value, cached_value.value
        index = self.variable("cache", "cache_index")
        k_new, v_new = project()
        start = index.value
        dt = cached_key.value.dtype
        k = jax.lax.dynamic_update_slice(cached_key.value, k_new.astype(dt), (0, 0, start, 0))
        v = jax.lax.dynamic_update_slice(cached_value.value, v_new.astype(dt), (0, 0, start, 0))
        cached_key.value, cached_value.value = k, v
        index.value = start + k_new.shape[2]
        return k, v
