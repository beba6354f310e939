"""The Pallas TPU kernels compiled by Mosaic for a described TPU v5e chip (libtpu, no TPU): the
equivalence tests run them in Pallas's interpreter on CPU, which cannot catch a kernel that
Mosaic refuses to lower; these compile the forward and backward programs for the chip itself,
with the shapes the models use them at, and check the kernels (not XLA's einsum) are in them."""

import jax
import jax.numpy as jnp
import pytest

from cairn.models import pallas_attention
from cairn.partitioning import platform, topology

MOSAIC = "tpu_custom_call"  # a Pallas kernel compiled for the chip, in the compiled module


@pytest.fixture(scope="module")
def chip():
    devices = topology.topology_devices("v5e:1x1")
    with platform.for_devices(devices):
        yield devices[0]


def _shaped(chip, *shapes_dtypes):
    sharding = jax.sharding.SingleDeviceSharding(chip)
    return [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes_dtypes]


def _forward_and_backward(fn, args, argnums):
    def loss(*a):
        return jnp.sum(fn(*a).astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=argnums)).lower(*args).compile()


def test_the_choice_follows_the_compile_target(chip):
    assert pallas_attention.on_tpu()  # inside the fixture's compile target: the kernels' platform
    assert pallas_attention.use_kernel(None, 512, 512, 64)


def test_splash_causal_grouped_query_packed_compiles_for_the_chip(chip):
    b, length, heads, kv_heads, d = 2, 512, 8, 2, 64
    q, k, v, seg = _shaped(
        chip,
        ((b, length, heads, d), jnp.bfloat16),
        ((b, length, kv_heads, d), jnp.bfloat16),
        ((b, length, kv_heads, d), jnp.bfloat16),
        ((b, length), jnp.int32),
    )

    def attend(q, k, v, seg):
        return pallas_attention.splash_attention(q, k, v, seg, causal=True, scale=d**-0.5)

    compiled = _forward_and_backward(attend, (q, k, v, seg), (0, 1, 2))
    text = compiled.as_text()
    assert text.count(MOSAIC) >= 2, "the forward and backward kernels"
    (_, grads) = jax.eval_shape(jax.value_and_grad(lambda *a: jnp.sum(attend(*a)), argnums=(0, 1, 2)), q, k, v, seg)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_flash_with_a_shared_bias_compiles_for_the_chip(chip):
    """T5's relative position bias `[1, heads, q, k]`, shared by the batch, and its gradient."""
    b, length, heads, d = 2, 256, 4, 64
    q, k, v, bias = _shaped(
        chip,
        ((b, length, heads, d), jnp.bfloat16),
        ((b, length, heads, d), jnp.bfloat16),
        ((b, length, heads, d), jnp.bfloat16),
        ((1, heads, length, length), jnp.float32),
    )

    def attend(q, k, v, bias):
        return pallas_attention.flash_attention(q, k, v, bias)

    compiled = _forward_and_backward(attend, (q, k, v, bias), (0, 1, 2, 3))
    assert compiled.as_text().count(MOSAIC) >= 2
