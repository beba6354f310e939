"""T5's relative position buckets and the learned per-head bias built from them."""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp


def relative_position_bucket(
    relative_position, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
):
    """Maps `key_position - query_position` to a bucket in `[0, num_buckets)`.

    Half the buckets (per direction when `bidirectional`) hold exact small distances; the
    rest grow logarithmically up to `max_distance`, beyond which all share the last bucket.
    Causal (`bidirectional=False`) maps every future position to bucket 0.
    """
    relative_position = jnp.asarray(relative_position)
    ret = jnp.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(relative_position.dtype) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # Computed in float32 and truncated, as in Mesh TensorFlow / transformers.
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    val_if_large = max_exact + (scaled * (num_buckets - max_exact)).astype(relative_position.dtype)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBias(nn.Module):
    """A learned scalar per (head, bucket), added to the attention logits of every layer.

    Returns `[1, heads, q_len, k_len]` for query positions `q_pos` and key positions `k_pos`;
    the table is stored as `param_dtype`.
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    dtype: jnp.dtype = jnp.float32
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(1.0)
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, q_pos, k_pos):
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(self.embedding_init, ("heads", "relpos_buckets")),
            (self.num_heads, self.num_buckets),
            self.param_dtype,
        )
        buckets = relative_position_bucket(
            k_pos[None, :] - q_pos[:, None], self.bidirectional, self.num_buckets, self.max_distance
        )
        bias = jnp.take(jnp.asarray(table, self.dtype), buckets, axis=1)  # [heads, q, k]
        return bias[None]
