"""Decode-mode bookkeeping of a decoder-only network: where a chunk of tokens sits in the cache.

The contract (shared by every decoder-only network): the first call with `decode=True` (on
zeros `[b, max_len]`) only sizes the `cache` collection. Each later call passes a chunk
`[b, n]`, `n >= 1`, whose tokens take cache positions `[i, i + n)` with `i = cache_index`;
query `j` attends the cached keys at positions `<= i + j` that are valid. Validity is kept in
`cached_key_mask` `[b, max_len]` (int32), written from the chunk's `decoder_segment_ids`
(0 = padding) or 1 when none are given; `cache_index` becomes `i + n`. The attention layers
keep `cached_key`, `cached_value` `[b, max_len, heads, head_dim]` and their own `cache_index`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def chunk_positions_and_mask(
    module: nn.Module,
    shape: tuple[int, int],
    segment_ids: jnp.ndarray | None = None,
    prefix: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray] | None:
    """`(q_pos [n], k_pos [max_len], mask [b, 1, n, max_len])` of a decode-mode chunk.

    Returns None on the sizing call (the cache did not exist yet; it is created here with
    `shape = (b, max_len)`). `prefix` `[b, n]` (1 = prompt position, as
    `decoder_causal_attention`) lets the chunk's prompt positions attend each other
    bidirectionally (prefix LM); it only reaches keys of the same chunk.
    """
    initialized = module.has_variable("cache", "cached_key_mask")
    key_mask = module.variable("cache", "cached_key_mask", lambda: jnp.zeros(shape, jnp.int32))
    index = module.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
        return None
    b, n = shape
    max_len = key_mask.value.shape[1]
    i = index.value
    valid = jnp.ones(shape, jnp.int32) if segment_ids is None else (segment_ids > 0).astype(jnp.int32)
    key_mask.value = jax.lax.dynamic_update_slice(key_mask.value, valid, (0, i))
    index.value = i + n
    q_pos = i + jnp.arange(n, dtype=jnp.int32)
    k_pos = jnp.arange(max_len, dtype=jnp.int32)
    mask = jnp.broadcast_to(k_pos[None, :] <= q_pos[:, None], (b, n, max_len))
    if prefix is not None:
        in_prefix = (prefix > 0).astype(jnp.int32)
        key_prefix = jax.lax.dynamic_update_slice(jnp.zeros((b, max_len), jnp.int32), in_prefix, (0, i))
        mask = mask | ((in_prefix[:, :, None] > 0) & (key_prefix[:, None, :] > 0))
    mask = mask & (key_mask.value[:, None, :] > 0)
    return q_pos, k_pos, mask[:, None]
