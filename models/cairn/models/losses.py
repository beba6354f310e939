"""Cross-entropy with label smoothing and z-loss, and the loss normalising factor (t5x semantics)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

NUM_REAL_TARGET_TOKENS = "NUM_REAL_TARGET_TOKENS"
NUM_TOTAL_TARGET_TOKENS = "NUM_TOTAL_TARGET_TOKENS"
AVERAGE_PER_SEQUENCE = "AVERAGE_PER_SEQUENCE"
NORMALIZING_MODES = (NUM_REAL_TARGET_TOKENS, NUM_TOTAL_TARGET_TOKENS, AVERAGE_PER_SEQUENCE)

LossNormalizingFactor = None | float | int | str


def cross_entropy_with_logits(logits, soft_targets, z_loss: float = 0.0) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-token `(-sum(targets * log_softmax) + z_loss * log_z**2, z_loss * log_z**2)`."""
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    loss = -jnp.sum(soft_targets * (logits - log_z), axis=-1)
    z = z_loss * jnp.square(log_z[..., 0])
    return loss + z, z


def smoothing_constants(vocab_size: int, label_smoothing: float) -> tuple[float, float, float]:
    """`(confidence, low, constant)`: the target's and every other token's soft-target
    probability, and the constant that makes a perfect prediction's loss 0."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    constant = (
        -(confidence * math.log(confidence) + (vocab_size - 1) * low * math.log(low + 1e-20))
        if label_smoothing > 0
        else 0.0
    )
    return confidence, low, constant


def smoothed_targets(targets, vocab_size: int, label_smoothing: float):
    """Soft targets and the constant that makes a perfect prediction's loss 0."""
    confidence, low, constant = smoothing_constants(vocab_size, label_smoothing)
    soft = jax.nn.one_hot(targets, vocab_size, dtype=jnp.float32) * (confidence - low) + low
    return soft, constant


def per_sequence_weights(weights, segment_ids=None):
    """Weights divided by their sequence's total weight (each segment of a packed row alone)."""
    weights = weights.astype(jnp.float32)
    if segment_ids is None:
        totals = jnp.sum(weights, axis=-1, keepdims=True)
    else:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        totals = jnp.einsum("bqk,bk->bq", same.astype(jnp.float32), weights)
    return jnp.where(totals > 0, weights / jnp.where(totals > 0, totals, 1.0), 0.0)


def normalizing_weights(
    weights, targets, loss_normalizing_factor: LossNormalizingFactor, segment_ids=None
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """`(weights, factor)`: the per-token weights of the summed loss (AVERAGE_PER_SEQUENCE
    divides each by its sequence's total) and what the sums are divided by (None: nothing);
    `weighted_cross_entropy` documents the modes. Shared with `chunked_loss`."""
    weights = weights.astype(jnp.float32)
    factor = None
    if isinstance(loss_normalizing_factor, str):
        if loss_normalizing_factor == NUM_REAL_TARGET_TOKENS:
            factor = jnp.sum(weights)
        elif loss_normalizing_factor == NUM_TOTAL_TARGET_TOKENS:
            factor = jnp.asarray(float(targets.size))
        elif loss_normalizing_factor == AVERAGE_PER_SEQUENCE:
            weights = per_sequence_weights(weights, segment_ids)
            factor = jnp.sum(weights)
        else:
            raise ValueError(
                f"unknown loss_normalizing_factor {loss_normalizing_factor!r}; "
                f"use a number, None or one of {NORMALIZING_MODES}"
            )
    elif loss_normalizing_factor is not None:
        factor = jnp.asarray(float(loss_normalizing_factor))
    return weights, factor


def weighted_cross_entropy(
    logits,
    targets,
    weights=None,
    *,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor: LossNormalizingFactor = None,
    segment_ids=None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """`(loss, z_loss, weight_sum)` summed over tokens, then divided by the normalising factor.

    `loss_normalizing_factor`: None (a plain sum), a number (sum / number), or a mode:
    `NUM_REAL_TARGET_TOKENS` (sum of weights), `NUM_TOTAL_TARGET_TOKENS` (all target slots), or
    `AVERAGE_PER_SEQUENCE` (each sequence's mean token loss, averaged over sequences;
    `segment_ids` tell the sequences of a packed row apart).
    """
    if logits.ndim != targets.ndim + 1:
        raise ValueError(f"logits {logits.shape} must have one more axis than targets {targets.shape}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    weights = (targets > 0).astype(jnp.float32) if weights is None else weights.astype(jnp.float32)
    soft, constant = smoothed_targets(targets, logits.shape[-1], label_smoothing)
    loss, z = cross_entropy_with_logits(logits, soft, z_loss)
    loss = loss - constant
    weights, factor = normalizing_weights(weights, targets, loss_normalizing_factor, segment_ids)
    total, total_z, weight_sum = jnp.sum(loss * weights), jnp.sum(z * weights), jnp.sum(weights)
    if factor is not None:
        factor = jnp.maximum(factor, 1e-8)
        total, total_z = total / factor, total_z / factor
    return total, total_z, weight_sum
