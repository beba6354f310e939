"""`argmax_last` (the accuracy metric's argmax over the vocabulary) equals `jnp.argmax` over
the last axis, ties included (the first of equal maxima), whatever the chunking; and the
tied-logits `attend_table` (one 2-D matmul over the flattened tokens) equals the `[b, l]`
einsum, forward and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models.argmax import argmax_last, chunk_size
from cairn.models.layers import attend_table


def test_chunk_size_is_the_largest_divisor_in_range_or_none():
    assert chunk_size(49152) == 2048
    assert chunk_size(32128) == 2008  # T5's vocabulary: 2^7 * 251
    assert chunk_size(256) == 128  # two chunks at least
    assert chunk_size(200) is None and chunk_size(32003) is None  # too small; prime


@pytest.mark.parametrize("vocab", [49152, 32128, 256, 200, 1031])
def test_equals_jnp_argmax_with_and_without_ties(vocab):
    rng = np.random.default_rng(vocab)
    x = rng.normal(size=(3, 5, vocab)).astype(np.float32)
    f = jax.jit(argmax_last)
    np.testing.assert_array_equal(f(x), jnp.argmax(x, -1))
    # Ties: few distinct values, so the max recurs in many chunks; the first index must win.
    tied = rng.integers(0, 4, size=x.shape).astype(np.float32)
    assert (np.sum(tied == tied.max(-1, keepdims=True), -1) > 1).all()
    np.testing.assert_array_equal(f(tied), jnp.argmax(tied, -1))
    # The max only at the very end, or only at the start, of the row.
    edge = x.copy()
    edge[0, 0, -1] = edge[0, 1, 0] = 100.0
    got = np.asarray(f(edge))
    assert got[0, 0] == vocab - 1 and got[0, 1] == 0 and got.dtype == np.int32


def test_chunks_only_on_cpu(monkeypatch):
    """Off the CPU (a TPU relayouts chunks that are not lane-aligned) it is the plain reduction."""
    x = jnp.zeros((2, 49152), jnp.float32)
    assert "reshape" in str(jax.make_jaxpr(argmax_last)(x))
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    text = str(jax.make_jaxpr(lambda a: argmax_last(a))(x))  # a new function: no cached trace
    assert "reshape" not in text and "argmax" in text


def test_attend_table_matches_the_einsum_and_its_gradients():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(300, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(2, 7, 300)), jnp.float32)

    def loss(f):
        return lambda x, t: jnp.sum(jnp.tanh(f(x, t)) * w)

    ref = lambda x, t: jnp.einsum("ble,ve->blv", x, t)
    np.testing.assert_allclose(attend_table(x, table), ref(x, table), rtol=1e-6, atol=1e-5)
    # The gradients compiled (op by op, each operation of the backward pass compiles its own).
    got = jax.jit(jax.grad(loss(attend_table), argnums=(0, 1)))(x, table)
    want = jax.jit(jax.grad(loss(ref), argnums=(0, 1)))(x, table)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert attend_table(x[0, 0], table).shape == (300,)  # one token, no batch axes
