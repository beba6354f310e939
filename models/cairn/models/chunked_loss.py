"""Cross-entropy over the vocabulary in token chunks, never holding the whole logits tensor.

A network asked for `return_hidden=True` returns an `Unembedding` instead of logits: its final
hidden states `[b, l, e]` (after the final norm and dropout, with a tied head's rescaling
applied) and its output projection (the tied embedding table `[vocab, e]` or a separate kernel
`[e, vocab]`, both already cast to the compute dtype). `chunked_cross_entropy` then computes
today's `losses.weighted_cross_entropy` sums and the accuracy count with `jax.lax.scan` over
chunks of sequence positions (every row of the batch in each chunk, so the batch-sharded
activations stay batch-sharded: see `chunk_layout`): only one chunk's float32 logits
`[b, c, vocab]` exist at a time.

Its gradient is computed in the same pass (a `jax.custom_vjp` whose forward rule produces the
per-chunk logits gradient `softmax * (1 + 2 z log_z) - soft_targets` at once and contracts it
with the projection and the hidden states): the backward pass only scales the saved `d hidden`
`[b, l, e]` and `d projection` (accumulated over chunks in float32) by the incoming cotangent.
That is three vocabulary matmuls per chunk (the forward's and the two of the backward), as
plain autodiff over whole logits does, instead of four with rematerialisation. Only the loss
sum is differentiable: the z-loss sum and the accuracy count are metrics (their cotangents are
ignored; the z-loss still reaches the gradient as part of the loss).

Logits are computed as `hidden @ projection` with float32 accumulation and output
(`preferred_element_type`), whatever the compute dtype: in float32 this is exactly the
whole-logits path; in bfloat16 the T5-style networks' whole-logits path rounds the logits to
bfloat16 first, so the two differ by that rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from cairn.models.argmax import argmax_last
from cairn.models.layers import constrain
from cairn.models.losses import smoothing_constants
from cairn.partitioning import platform

CHUNK_ACT = ("batch", "length", "embed")
CHUNK_LOGITS = ("batch", "length", "vocab")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Unembedding:
    """A network's final hidden states and output projection (`return_hidden=True`).

    `hidden` `[b, l, e]`; `kernel` `[vocab, e]` when `tied` (the embedding table), else
    `[e, vocab]`; both in the compute dtype (gradients flow back through them to the
    parameters). `logits()` is what the network would have returned.
    """

    hidden: jax.Array
    kernel: jax.Array
    tied: bool = dataclasses.field(metadata=dict(static=True))

    @property
    def vocab_size(self) -> int:
        return self.kernel.shape[0] if self.tied else self.kernel.shape[1]

    def logits(self, hidden: jax.Array | None = None) -> jax.Array:
        """float32 logits `[..., vocab]` of `hidden` (default: all of `self.hidden`)."""
        return project(self.hidden if hidden is None else hidden, self.kernel, self.tied)


def project(x, kernel, tied: bool):
    """`x @ kernel.T` (tied) or `x @ kernel`, float32 out, as one 2-D matmul over the tokens."""
    flat = x.reshape(-1, x.shape[-1])
    spec = "te,ve->tv" if tied else "te,ev->tv"
    out = jnp.einsum(spec, flat, kernel, preferred_element_type=jnp.float32)
    return out.reshape(*x.shape[:-1], out.shape[-1])


#: On a TPU a chunk's positions are a multiple of this (its bfloat16 tiles' rows), so that a
#: chunk's `[b, positions, vocab]` logits flatten to `[tokens, vocab]` without a copy (llama_1b
#: at batch 12: 158 positions cost a 29 ms relayout per step on a v5e, benchmarks/RESULTS.md).
TPU_POSITION_ALIGN = 16


def chunk_layout(batch: int, length: int, chunk_size: int, align: int = 1) -> tuple[int, int]:
    """`(num_chunks, positions_per_chunk)` for chunks of about `chunk_size` tokens.

    A chunk holds every row of the batch and `chunk_size // batch` positions (at least 1),
    rounded so that the chunks are as even as possible: `num_chunks * positions >= length`
    with the least padding (e.g. 114 positions in 2 chunks of 57, not 64 + 50 padded to 128).
    With `align` > 1 (and `length >= align`), `positions` is a multiple of `align`: of the chunk
    counts up to twice the unaligned one, the one with the least padding (then the fewest).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    per_chunk = max(1, min(length, chunk_size // max(batch, 1)))
    num = math.ceil(length / per_chunk)
    if align <= 1 or length < align:
        return num, math.ceil(length / num)
    layouts = set()
    for n in range(num, 2 * num + 1):
        positions = -(-math.ceil(length / n) // align) * align
        layouts.add((math.ceil(length / positions), positions))
    # the least padding, then the fewest chunks
    return min(layouts, key=lambda c: (c[0] * c[1] - length, c[0]))


def _align() -> int:
    return TPU_POSITION_ALIGN if platform.backend() == "tpu" else 1


@dataclasses.dataclass(frozen=True)
class _Spec:
    """The static options of one chunked loss (hashable: a `custom_vjp` non-diff argument)."""

    tied: bool
    num_chunks: int
    positions: int
    label_smoothing: float
    z_loss: float


def _to_chunks(x, spec: _Spec):
    """`[b, l, ...]` -> `[n, b, c, ...]` (zero-padded along `l`)."""
    pad = spec.num_chunks * spec.positions - x.shape[1]
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape(x.shape[0], spec.num_chunks, spec.positions, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _from_chunks(x, length: int):
    """The inverse of `_to_chunks`."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _chunk_terms(x, kernel, targets, spec: _Spec):
    """One chunk's float32 logits, `log_z`, per-token loss (with z-loss, less the smoothing
    constant) and z-loss, and the target one-hot mask (never materialised apart from logits)."""
    logits = constrain(project(constrain(x, CHUNK_ACT), kernel, spec.tied), CHUNK_LOGITS)
    vocab = logits.shape[-1]
    confidence, low, constant = smoothing_constants(vocab, spec.label_smoothing)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    is_target = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[..., None]
    target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)
    has_target = ((targets >= 0) & (targets < vocab)).astype(jnp.float32)
    cross = -(confidence - low) * has_target * (target_logit - log_z)
    if low:
        cross = cross - low * (jnp.sum(logits, axis=-1) - vocab * log_z)
    z = spec.z_loss * jnp.square(log_z)
    return logits, log_z, is_target, cross + z - constant, z


def _sums(hidden, kernel, targets, weights, mask, spec: _Spec, with_grads: bool):
    """`(loss_sum, z_sum, correct)` and, `with_grads`, `(d hidden, d kernel)` of `loss_sum`."""
    xs = (_to_chunks(hidden, spec), _to_chunks(targets, spec), _to_chunks(weights, spec), _to_chunks(mask, spec))
    confidence, low, _ = smoothing_constants(kernel.shape[0] if spec.tied else kernel.shape[1], spec.label_smoothing)

    def body(carry, chunk):
        x, t, w, m = chunk
        logits, log_z, is_target, loss, z = _chunk_terms(x, kernel, t, spec)
        correct = jnp.sum((argmax_last(logits) == t).astype(jnp.float32) * m)
        sums = (carry[0] + jnp.sum(loss * w), carry[1] + jnp.sum(z * w), carry[2] + correct)
        if not with_grads:
            return sums, None
        probs = jnp.exp(logits - log_z[..., None])
        soft = jnp.where(is_target, confidence, low) if low else is_target.astype(jnp.float32) * confidence
        scale = 1.0 + 2.0 * spec.z_loss * log_z
        d_logits = (probs * scale[..., None] - soft) * w[..., None]
        d_logits = constrain(d_logits.astype(kernel.dtype), CHUNK_LOGITS)
        flat_x, flat_d = x.reshape(-1, x.shape[-1]), d_logits.reshape(-1, d_logits.shape[-1])
        if spec.tied:
            dx = jnp.einsum("tv,ve->te", flat_d, kernel, preferred_element_type=jnp.float32)
            dk = jnp.einsum("tv,te->ve", flat_d, flat_x, preferred_element_type=jnp.float32)
        else:
            dx = jnp.einsum("tv,ev->te", flat_d, kernel, preferred_element_type=jnp.float32)
            dk = jnp.einsum("te,tv->ev", flat_x, flat_d, preferred_element_type=jnp.float32)
        dk = constrain(carry[3] + dk, ("vocab", "embed") if spec.tied else ("embed", "vocab"))
        dx = constrain(dx.reshape(x.shape).astype(hidden.dtype), CHUNK_ACT)
        return (*sums, dk), dx

    zero = jnp.zeros((), jnp.float32)
    init: tuple[Any, ...] = (zero, zero, zero)
    if with_grads:
        init = (*init, jnp.zeros(kernel.shape, jnp.float32))
    carry, dxs = jax.lax.scan(body, init, xs)
    if not with_grads:
        return carry, None
    return carry[:3], (_from_chunks(dxs, hidden.shape[1]), carry[3].astype(kernel.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _chunked_sums(hidden, kernel, targets, weights, mask, spec: _Spec):
    return _sums(hidden, kernel, targets, weights, mask, spec, with_grads=False)[0]


def _chunked_sums_fwd(hidden, kernel, targets, weights, mask, spec: _Spec):
    sums, grads = _sums(hidden, kernel, targets, weights, mask, spec, with_grads=True)
    return sums, (grads, weights, mask)


def _chunked_sums_bwd(spec: _Spec, res, cotangents):
    (d_hidden, d_kernel), weights, mask = res
    g = cotangents[0]  # only the loss sum is differentiated (module docstring)
    # Integer targets take no cotangent (None); the weights and mask are data.
    return (
        d_hidden * g.astype(d_hidden.dtype),
        d_kernel * g.astype(d_kernel.dtype),
        None,
        jnp.zeros_like(weights),
        jnp.zeros_like(mask),
    )


_chunked_sums.defvjp(_chunked_sums_fwd, _chunked_sums_bwd)


def chunked_cross_entropy(
    head: Unembedding,
    targets,
    weights,
    chunk_size: int,
    *,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    accuracy_mask=None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """`(loss_sum, z_loss_sum, correct)`: `losses.weighted_cross_entropy`'s sums before the
    normalising factor (`sum(token_loss * weights)`, `sum(z * weights)`), and the number of
    tokens whose argmax is the target among `accuracy_mask` (default `weights > 0`), computed
    in chunks of about `chunk_size` tokens (`chunk_layout`). Differentiable in `head` through
    the loss sum only (module docstring)."""
    b, length = targets.shape
    if head.hidden.shape[:2] != (b, length):
        raise ValueError(f"hidden states {head.hidden.shape} do not match targets {targets.shape}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    weights = weights.astype(jnp.float32)
    mask = (weights > 0).astype(jnp.float32) if accuracy_mask is None else accuracy_mask.astype(jnp.float32)
    num, positions = chunk_layout(b, length, chunk_size, _align())
    spec = _Spec(head.tied, num, positions, float(label_smoothing), float(z_loss))
    return _chunked_sums(head.hidden, head.kernel, targets.astype(jnp.int32), weights, mask, spec)


def chunked_token_log_probs(head: Unembedding, targets, chunk_size: int) -> jnp.ndarray:
    """`[b, l]`: `log_softmax(logits)[target]` of every token, in chunks (`chunk_layout`); for
    scoring (plain autodiff: a gradient through it holds one chunk's logits per chunk in the
    scan's residuals)."""
    b, length = targets.shape
    num, positions = chunk_layout(b, length, chunk_size, _align())
    spec = _Spec(head.tied, num, positions, 0.0, 0.0)

    def body(_, chunk):
        x, t = chunk
        logits, log_z, is_target, _, _ = _chunk_terms(x, head.kernel, t, spec)
        return None, jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1) - log_z

    _, out = jax.lax.scan(body, None, (_to_chunks(head.hidden, spec), _to_chunks(targets.astype(jnp.int32), spec)))
    return _from_chunks(out, length)
