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

import jax
import jax.numpy as jnp
import numpy as np

from cairn.partitioning import platform


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


RopeTables = tuple[jnp.ndarray, jnp.ndarray]


def rope_tables(positions: jnp.ndarray, inv_freq: np.ndarray) -> RopeTables:
    """`(cos, sin)`, each `[batch, length, 1, head_dim]` float32, of `positions` `[batch, length]`.

    A network computes them once per call and hands them to every layer: computed inside
    each layer, XLA:CPU fuses the cosine and sine into every consumer and evaluates them once
    per head, forward and backward, in every layer.
    """
    angles = _angles(positions, inv_freq, jnp)
    return jnp.cos(angles), jnp.sin(angles)


def _angles(positions, inv_freq: np.ndarray, xp):
    """`[b, l, 1, head_dim]` float32 rotation angles of `positions` `[b, l]`, with `xp` (jnp or np)."""
    angles = positions.astype(np.float32)[..., None] * xp.asarray(inv_freq)  # [b, l, d/2]
    return xp.concatenate([angles, angles], axis=-1)[:, :, None, :]


def config_rope_tables(config, positions: jnp.ndarray | int) -> RopeTables:
    """`rope_tables` with a `LlamaConfig`'s head_dim, theta and scaling, of `positions`
    `[batch, length]`, or of `0..positions-1` as constants `[1, positions, 1, head_dim]` (XLA
    cannot fuse, and so recompute, a constant's cosine into every consumer)."""
    scaling = dict(config.rope_scaling) if config.rope_scaling else None
    inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, scaling)
    if isinstance(positions, int):
        angles = _angles(np.arange(positions)[None], inv_freq, np)
        return np.cos(angles), np.sin(angles)
    return rope_tables(positions, inv_freq)


def rotate_half_matrix(head_dim: int) -> np.ndarray:
    """`[head_dim, head_dim]` float32 `R` with `x @ R == concatenate([-x[half:], x[:half]])`:
    one -1 or +1 per column, so the product is exact in any dtype."""
    half = head_dim // 2
    r = np.zeros((head_dim, head_dim), np.float32)
    r[np.arange(half) + half, np.arange(half)] = -1.0
    r[np.arange(half), np.arange(half) + half] = 1.0
    return r


def rotate(x: jnp.ndarray, tables: RopeTables, via_matmul: bool | None = None) -> jnp.ndarray:
    """Rotates `x` `[batch, length, heads, head_dim]` by `rope_tables`' `(cos, sin)` (in
    float32, returned in `x`'s dtype).

    `via_matmul` (None: on TPU) forms the rotated half as `x @ rotate_half_matrix` instead of
    slicing and concatenating the halves. On a TPU the halves of a 64-wide head are 32 lanes
    of 128, so the sliced form moves four times the bytes it uses: in llama_1b's training step
    on a v5e it took ~230 ms of 2,170 (benchmarks/RESULTS.md). The product is the same numbers
    (each output one input, negated or not); in bfloat16 the gradient's two terms are rounded
    apart (within one bfloat16 rounding of the sliced form's), and the MXU's cost is small."""
    cos, sin = tables
    if via_matmul is None:
        via_matmul = platform.backend() == "tpu"
    x32 = x.astype(jnp.float32)
    if via_matmul:
        # In `x`'s dtype with float32 accumulation: exact (float32 at full precision, so that a
        # TPU does not round it to bfloat16 first).
        r = jnp.asarray(rotate_half_matrix(x.shape[-1]), x.dtype)
        precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
        rotated = jnp.einsum("blhd,de->blhe", x, r, precision=precision, preferred_element_type=jnp.float32)
        return (x32 * cos + rotated * sin).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray) -> jnp.ndarray:
    """Rotates `x` `[batch, length, heads, head_dim]` by `positions` `[batch, length]` (computed
    in float32, returned in `x`'s dtype)."""
    return rotate(x, rope_tables(positions, inv_freq))
