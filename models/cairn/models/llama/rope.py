"""Rotary position embeddings in the "rotate_half" layout of transformers' Llama: the rotation
pairs dimension `i` with `i + head_dim/2` (not adjacent dimensions), so Hugging Face weights
load without permuting the query and key kernels.

`inverse_frequencies` follows transformers' default rope and its "llama3" scaling
(`_compute_llama3_parameters`): wavelengths above `original_max_position_embeddings /
low_freq_factor` are divided by `factor`, those below `... / high_freq_factor` kept, and the
band between interpolated smoothly.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, float] | None = None) -> np.ndarray:
    """`[head_dim // 2]` float32: `theta ** (-2i / head_dim)`, llama3-scaled when `scaling` is given."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray) -> jnp.ndarray:
    """Rotates `x` `[batch, length, heads, head_dim]` by `positions` `[batch, length]` (computed
    in float32, returned in `x`'s dtype)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [b, l, d/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [b, l, 1, d]
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)
