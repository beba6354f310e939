"""Llama's attention: grouped-query heads, RoPE, `jax.nn.dot_product_attention` (XLA's, or
cuDNN's fused attention on GPU: `cairn.models.gpu_attention`) or the Pallas splash kernel
(`cairn.models.pallas_attention`), and the decode cache contract shared with `gpt.Decoder`.

Kernels: `query/kernel [embed, heads, head_dim]`, `key/kernel` and `value/kernel
[embed, kv_heads, head_dim]`, `out/kernel [heads, head_dim, embed]`. The key/value head axis is
named `heads` like the query's (the standard rules shard both over `model`, which keeps each
query head on the device of its key/value head when `num_kv_heads` divides by the model axis;
otherwise the key/value kernels fall back to `kv` as every other indivisible dimension does).
The keys and values themselves do not fall back so when the query's heads take that axis: XLA's
attention gets them with their heads whole (`key_value_axes`).
`q . k` is scaled by `head_dim ** -0.5`; logits and softmax are float32.

Decode cache (`decode=True`): the first call only sizes `cached_key` / `cached_value`
`[b, max_len, kv_heads, head_dim]` (flat, `[b, max_len, kv_heads * head_dim]`, on the
`FLAT_CACHE_PLATFORMS`: see `flat_cache`), `cached_key_mask` `[b, max_len]` (int32, 1 = a real
key) and `cache_index` (scalar int32). Each later call takes a chunk `[b, n]`: its tokens go to
cache positions `[i, i + n)` with `i = cache_index` (RoPE positions `i..i+n-1` unless given);
query `j` sees cached keys at positions `<= i + j` whose mask is 1 (the chunk's segment ids > 0
when given, else 1), and with `decoder_causal_attention` the chunk's prompt positions see each
other (a prefix LM's prefill); `cache_index` becomes `i + n`. A cached call attends only the
cache's first positions holding every written one (`attend_written`: the smallest of the
`cache_buckets`), not the whole cache (off TPU: see `attend_written`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint

from cairn.models import gpu_attention, pallas_attention
from cairn.models.layers import ATTENTION_PROJECTIONS, Kernel, constrain, dense, named, project_heads
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.rope import config_rope_tables, rotate
from cairn.partitioning import platform
from cairn.partitioning.partitioner import current_partitioner
from cairn.partitioning.rules import logical_to_mesh_spec

HEAD_ACT = ("batch", "length", "heads", "kv")
FLAT_CACHE_ACT = ("batch", "length", "heads")  # a flat decode cache's (`flat_cache`)
#: Keys' and values' logical axes before XLA's attention where the query's heads take a mesh
#: axis that the key/value heads do not divide (`key_value_axes`): `head_dim` kept whole.
GROUPED_KV_ACT = ("batch", "length", "heads", None)
__all__ = [
    "GROUPED_KV_ACT",
    "HEAD_ACT",
    "Kernel",
    "LlamaAttention",
    "FLAT_CACHE_PLATFORMS",
    "attend_cache",
    "attend_flat_step",
    "attend_written",
    "cache_buckets",
    "flat_cache",
    "key_value_axes",
    "write_cache",
]


#: The decode cache's layout on TPU, major to minor: batch, head, position, head_dim (a flat
#: cache `[b, max_len, kv_heads * head_dim]`: row-major).
TPU_CACHE_LAYOUT = (0, 2, 1, 3)
TPU_FLAT_CACHE_LAYOUT = (0, 1, 2)
#: Platforms whose decode cache is flat (`flat_cache`).
FLAT_CACHE_PLATFORMS: tuple[str, ...] = ("tpu",)
#: Whether a decode step over a flat cache attends only its written prefix (`attend_written`):
#: llama_1b at batch 32 on a v5e, 4.04 ms a step against 4.11 over the whole flat cache (and 4.52
#: over the four-dimensional one), benchmarks/RESULTS.md.
FLAT_WRITTEN_PREFIX = True


def flat_cache() -> bool:
    """Whether the decode cache being traced is flat, `[b, max_len, kv_heads * head_dim]`: on the
    `FLAT_CACHE_PLATFORMS` (`platform.backend()`). A TPU tiles an array's two minor dimensions
    by 128 lanes, so a `[.., position, head_dim]` cache of 64-wide heads takes (and every decode
    step reads) twice its bytes; flat, its minor dimension is `kv_heads * head_dim` (512 for
    llama_1b) and nothing is padded. A decode step then attends it with `attend_flat_step`."""
    return platform.backend() in FLAT_CACHE_PLATFORMS


def write_cache(cache: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
    """`cache` `[b, max_len, kv_heads, head_dim]` (or flat, `[b, max_len, kv_heads * head_dim]`)
    with `chunk` `[b, n, kv_heads, head_dim]` written at positions `[start, start + n)`: the one
    place a decode step writes the cache (module-level, so that an accelerator benchmark can
    compare other ways of writing it).

    On TPU the cache's layout is pinned (`TPU_CACHE_LAYOUT`: head-major; a flat one row-major).
    Left to itself, XLA lays the cache out with positions minor (what the `q . k` product
    prefers), and then each step's one-position write rewrites the whole cache: 1.7 ms of a
    5.1 ms llama_1b step at batch 32 on a v5e; pinned, the step takes 4.5 ms
    (benchmarks/RESULTS.md, `accel_bench.py`).
    """
    chunk = chunk.reshape(*chunk.shape[:2], *cache.shape[2:]).astype(cache.dtype)
    out = jax.lax.dynamic_update_slice(cache, chunk, (0, start) + (0,) * (cache.ndim - 2))
    if platform.backend() == "tpu":
        layout = TPU_CACHE_LAYOUT if cache.ndim == 4 else TPU_FLAT_CACHE_LAYOUT
        out = with_layout_constraint(out, Layout(major_to_minor=layout))
    return out


def attend_flat_step(q, k, v, mask, *, scale: float):
    """`jax.nn.dot_product_attention` (XLA's numerics) of one decode step's queries `q`
    `[b, 1, heads, d]` over a flat cache `k`, `v` `[b, max_len, kv_heads * d]` (`mask`
    `[b, 1, 1, max_len]`), without unflattening the cache.

    Each query head is spread over its key/value head's `d` columns of a zero `[kv_heads * d]`
    row (a block-diagonal query), so `q . k` is one product that reads the cache in its own
    layout; the values' product gives every head's output for every key/value head, and the
    diagonal blocks are kept. The products do `kv_heads` times the attention's FLOPs, which a
    decode step (bound by reading the weights and the cache) does not notice; the zeros add
    nothing to a sum."""
    b, n, h, d = q.shape
    kvh = k.shape[-1] // d
    if n != 1 or kvh * d != k.shape[-1] or h % kvh:
        raise ValueError(f"attend_flat_step: q {q.shape} is not one step of the flat cache {k.shape}")
    eye = jnp.eye(kvh, dtype=q.dtype)
    blocks = jnp.einsum("bkgd,kj->bkgjd", q.reshape(b, kvh, h // kvh, d), eye).reshape(b, h, kvh * d)
    logits = jnp.einsum("bhe,bte->bht", blocks, k, preferred_element_type=jnp.float32) * jnp.float32(scale)
    big_negative = jnp.float32(-0.7 * jnp.finfo(jnp.float32).max)
    logits = jnp.where(mask[:, 0], logits, big_negative)  # mask [b, 1, 1, t] -> [b, 1, t]
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    every = jnp.einsum("bht,bte->bhe", probs, v).reshape(b, kvh, h // kvh, kvh, d)
    return jnp.einsum("bkgjd,kj->bkgd", every, eye.astype(every.dtype)).reshape(b, 1, h, d)


def cache_buckets(max_len: int, smallest: int | None = None) -> tuple[int, ...]:
    """The prefix lengths a cached call may attend: `smallest`, twice that, ... below `max_len`,
    then `max_len` itself. `smallest` defaults to 128 on TPU (its lane width) and 32 elsewhere."""
    if smallest is None:
        smallest = 128 if platform.backend() == "tpu" else 32
    sizes, size = [], smallest
    while size < max_len:
        sizes.append(size)
        size *= 2
    return (*sizes, max_len)


def attend_written(q, k, v, mask, written, *, scale: float, implementation: str | None, smallest: int | None = None):
    """`jax.nn.dot_product_attention` of `q` `[b, n, heads, d]` over the cache `k`, `v`
    `[b, max_len, kv_heads, d]` (`mask` `[b, 1, n, max_len]`; a flat cache: `attend_flat_step`),
    reading only its first `size` positions: the smallest of `cache_buckets` holding the
    `written` (traced) ones. Keys past `written` are masked, so the result is the whole cache's;
    a step reads at most twice the written positions (or the smallest bucket) instead of the
    whole cache (llama_1b decoding 128 tokens after a 128-token prompt holds 383 positions and
    writes at most 256).

    Not on TPU's four-dimensional cache: there the conditional made XLA copy each layer's cache
    into another layout on every step (llama_1b at batch 32 on a v5e: 4.52 -> 4.66 ms a step);
    the flat cache has no such copy (4.11 -> 4.04 ms)."""
    sizes = cache_buckets(k.shape[1], smallest)

    def attend(size):
        def fn(q, k, v, mask):
            if k.ndim == 3:  # a flat cache (`flat_cache`)
                return attend_flat_step(q, k[:, :size], v[:, :size], mask[..., :size], scale=scale)
            return jax.nn.dot_product_attention(
                q, k[:, :size], v[:, :size], mask=mask[..., :size], scale=scale, implementation=implementation
            )

        return fn

    if len(sizes) == 1:
        return attend(sizes[0])(q, k, v, mask)
    which = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), jnp.asarray(written, jnp.int32))
    return jax.lax.switch(which, [attend(size) for size in sizes], q, k, v, mask)


def attend_cache(q, k, v, mask, written, *, scale: float):
    """XLA's attention of a cached call's queries `q` `[b, n, heads, d]` over the cache `k`, `v`
    (`[b, max_len, kv_heads, d]`, or flat: `flat_cache`) with `written` positions written.

    A flat cache: one decode step attends it in its own layout (`attend_flat_step`), up to the
    written prefix with `FLAT_WRITTEN_PREFIX`; a longer chunk (a prefill) attends it
    unflattened (on TPU a copy, once per chunk). A four-dimensional cache: up to the written
    prefix (`attend_written`) except on TPU (see there), where the whole cache is attended."""
    if k.ndim == 3 and q.shape[1] > 1:
        k, v = (constrain(x.reshape(*x.shape[:2], -1, q.shape[-1]), HEAD_ACT) for x in (k, v))
    if k.ndim == 3 and not FLAT_WRITTEN_PREFIX:
        return attend_flat_step(q, k, v, mask, scale=scale)
    if k.ndim == 3 or platform.backend() != "tpu":
        return attend_written(q, k, v, mask, written, scale=scale, implementation="xla")
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")


def key_value_axes(q_shape, kv_shape) -> tuple[str | None, ...]:
    """The logical axes that keys and values `[b, l, kv_heads, head_dim]` are constrained to
    before XLA's attention of queries `[b, l, heads, head_dim]` (`q_shape`): `HEAD_ACT`, unless
    the active `cairn.partitioning` partitioner shards the query's heads over mesh axes that the
    key/value heads do not take (`num_kv_heads` does not divide them: 2 key/value heads on a
    `model` axis of 4). `HEAD_ACT` would then shard `head_dim` over those axes (the `kv`
    fallback), and XLA's grouped-query attention regroups the query's sharded heads into
    `[kv_heads, heads // kv_heads]`, splitting the axis over both. With the batch sharded over
    another axis as well, XLA's SPMD partitioner then computed wrong key and value gradients
    (off by as much as the gradients themselves: 2 of 8 heads on a data 2 x model 4 mesh; the
    loss and the logits right). `GROUPED_KV_ACT` instead: every device of the axis holds the
    key/value heads whole (what XLA fell back to anyway: it gathered them to regroup), and each
    computes its own query heads' attention.

    The cache of a decode step (forward only) and the splash kernel (`jax.shard_map` over the
    heads only where both split alike) keep `HEAD_ACT`, as does a query whose heads fall back
    to `kv` too (both sharded over `head_dim` alike)."""
    partitioner = current_partitioner()
    if partitioner is None or not partitioner.constrain_activations:
        return HEAD_ACT

    def heads(shape):
        spec = logical_to_mesh_spec(HEAD_ACT, partitioner.rules, partitioner.mesh.shape, shape, "<attention>", "quiet")
        return spec[2]

    q_heads = heads(q_shape)
    return GROUPED_KV_ACT if q_heads is not None and heads(kv_shape) != q_heads else HEAD_ACT


class LlamaAttention(nn.Module):
    """Self-attention from `x` `[b, l, embed]`; see the module docstring for the decode cache.

    `positions` `[b, l]` (RoPE; None: `0..l-1`, or the cache positions when decoding), or the
    `rope.rope_tables` of the positions (a network computes them once for all its layers);
    `mask` `[b|1, 1, l, l]` bool or None (in decode mode: the prefix `[b, l]`, 1 = prompt
    position, or None); `causal` adds the causal mask (not in decode mode, which builds its
    own); `segment_ids` `[b, l]`: when decoding the key mask; otherwise, with `causal`, the
    packing that `mask` (then their segment mask, or None) expresses, for the splash kernel.

    Without a decode cache, the splash kernel runs (`pallas_attention.use_kernel`) for a causal
    attention whose `mask` is None or the segment mask of `segment_ids`, or a full attention
    without `mask`; a prefix LM's mask (differing per row) takes XLA's path. Where the kernel
    does not run, cuDNN's fused attention may (`gpu_attention.fused_implementation`: the same
    `mask`, as a bias, and `is_causal`); decode steps take XLA's.
    """

    config: LlamaConfig
    causal: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x, positions, mask, segment_ids):
        cfg = self.config
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        e, h, kvh, d = cfg.emb_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        std = cfg.init_std
        wq = Kernel((e, h, d), ("embed", "heads", "kv"), std, dt, pdt, fp8=True, name="query")()
        wk = Kernel((e, kvh, d), ("embed", "heads", "kv"), std, dt, pdt, fp8=True, name="key")()
        wv = Kernel((e, kvh, d), ("embed", "heads", "kv"), std, dt, pdt, fp8=True, name="value")()
        wo = Kernel((h, d, e), ("heads", "kv", "embed"), std, dt, pdt, fp8=True, name="out")()
        q, k, v = (project_heads(x, w, name) for w, name in zip((wq, wk, wv), ATTENTION_PROJECTIONS))
        b, n = x.shape[0], x.shape[1]
        causal, written = self.causal, None
        if self.decode and self.has_variable("cache", "cached_key"):
            index = self.variable("cache", "cache_index")
            start = index.value
            if positions is None:
                positions = jnp.broadcast_to(start + jnp.arange(n, dtype=jnp.int32), (b, n))
            tables = self._tables(positions)
            q, k = rotate(q, tables), rotate(k, tables)
            k, v, mask = self._update_cache(k, v, segment_ids, index, mask)
            written = index.value
        else:
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
            tables = self._tables(positions)
            q, k = rotate(q, tables), rotate(k, tables)
            if self.decode:  # the sizing call: an empty cache of this call's shape
                shape = (b, n, kvh * d) if flat_cache() else k.shape
                self.variable("cache", "cached_key", jnp.zeros, shape, k.dtype)
                self.variable("cache", "cached_value", jnp.zeros, shape, v.dtype)
                self.variable("cache", "cached_key_mask", jnp.zeros, (b, n), jnp.int32)
                self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
                mask = None  # decode mode's `mask` is a prefix `[b, n]`, not an attention mask
        scale = d**-0.5
        if written is not None:  # a cached call: k, v are the cache, constrained by `_update_cache`
            out = attend_cache(constrain(q, HEAD_ACT), k, v, mask, written, scale=scale)
            return named(dense(constrain(out, HEAD_ACT), wo, 2), ATTENTION_PROJECTIONS[3])
        kernel = self._use_kernel(n, mask, segment_ids, causal)
        fused = None if kernel else self._fused(q, k, mask)
        # XLA's attention of a (differentiable) call: see `key_value_axes`.
        kv_axes = HEAD_ACT if kernel or fused else key_value_axes(q.shape, k.shape)
        q, k, v = constrain(q, HEAD_ACT), constrain(k, kv_axes), constrain(v, kv_axes)
        if kernel:
            segments = segment_ids if mask is not None else None
            out = pallas_attention.splash_attention(q, k, v, segments, causal=causal, scale=scale)
        elif fused is not None:
            out = gpu_attention.attention(q, k, v, None, mask, is_causal=causal, scale=scale, implementation=fused)
        else:
            out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal, implementation="xla")
        return named(dense(constrain(out, HEAD_ACT), wo, 2), ATTENTION_PROJECTIONS[3])

    def _use_kernel(self, length: int, mask, segment_ids, causal: bool) -> bool:
        """Whether this call runs the splash kernel (`pallas_attention.use_kernel`)."""
        # Decode steps keep XLA's path; initialising makes parameters only (any shape).
        if self.decode or self.is_initializing():
            return False
        why = None
        if mask is not None and (not causal or segment_ids is None):
            why = "the mask is not a causal packed-segment mask (a prefix LM's differs per row)"
        return pallas_attention.use_kernel(
            self.config.attention_implementation, length, length, self.config.head_dim, why
        )

    def _fused(self, q, k, mask) -> str | None:
        """`gpu_attention.fused_implementation` of this call (decode mode and initialising: None)."""
        if self.decode or self.is_initializing():
            return None
        bias_shape = None if mask is None else (mask.shape[0], 1, q.shape[1], k.shape[1])
        return gpu_attention.fused_implementation(
            self.config.attention_implementation, q.shape, k.shape, q.dtype, bias_shape
        )

    def _tables(self, positions):
        """`rope_tables` of `positions`, or `positions` when they are tables already."""
        return positions if isinstance(positions, tuple) else config_rope_tables(self.config, positions)

    def _update_cache(self, k_new, v_new, segment_ids, index, prefix=None):
        """Writes the chunk at `[i, i + n)` (`i = index.value`); returns the whole cache and the
        chunk's mask. `prefix` `[b, n]` (1 = prompt position) lets the chunk's prompt positions
        attend each other (a prefix LM's prefill)."""
        cached_key = self.variable("cache", "cached_key")
        cached_value = self.variable("cache", "cached_value")
        key_mask = self.variable("cache", "cached_key_mask")
        start = index.value
        b, n = k_new.shape[0], k_new.shape[1]
        real = jnp.ones((b, n), jnp.int32) if segment_ids is None else (segment_ids > 0).astype(jnp.int32)
        k, v = write_cache(cached_key.value, k_new, start), write_cache(cached_value.value, v_new, start)
        keys = jax.lax.dynamic_update_slice(key_mask.value, real, (0, start))
        cached_key.value, cached_value.value, key_mask.value = k, v, keys
        index.value = start + n
        max_len = keys.shape[1]
        query_pos = start + jnp.arange(n, dtype=jnp.int32)
        visible = jnp.arange(max_len, dtype=jnp.int32)[None, :] <= query_pos[:, None]  # [n, max_len]
        visible = jnp.broadcast_to(visible[None], (b, n, max_len))
        if prefix is not None:
            in_prefix = (prefix > 0).astype(jnp.int32)
            key_prefix = jax.lax.dynamic_update_slice(jnp.zeros((b, max_len), jnp.int32), in_prefix, (0, start))
            visible = visible | ((in_prefix[:, :, None] > 0) & (key_prefix[:, None, :] > 0))
        mask = (visible & (keys > 0)[:, None, :])[:, None]  # [b, 1, n, max_len]
        axes = HEAD_ACT if k.ndim == 4 else FLAT_CACHE_ACT
        return constrain(k, axes), constrain(v, axes), mask
