"""`layers.dense`'s platform gate: the CPU backward (the weight gradient as one matmul behind an
`optimization_barrier`) only on CPU, autodiff's plain VJP on GPU/TPU; forced either way here.

Both ways the forward is bitwise equal, and so is the input gradient of a 2-D kernel; the CPU
way multiplies flattened 2-D operands, so with a kernel of several input or output axes the input
gradient, and always the weight gradient, sum the same products in another order and agree to
float32 rounding: max |a - b| <= 1e-5 * max |b| (measured <= 1.2e-6 for sums over 512 tokens). A
model's loss gradients agree to the same bound.
"""

import jax
import numpy as np
import pytest

from cairn.models import EncoderDecoderModel, layers

BOUND = 1e-5


def _close(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.max(np.abs(a - b)) <= BOUND * np.max(np.abs(b)), np.max(np.abs(a - b)) / np.max(np.abs(b))


def _normal(seed, *shapes):
    """Standard normal float32 arrays drawn with numpy (no random-number program to compile)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape, np.float32) for shape in shapes]


def test_auto_follows_the_backend_and_switch_forces_either(monkeypatch):
    assert jax.default_backend() == "cpu"
    assert layers.dense_vjp_variant() == "cpu"
    assert layers.dense_vjp_variant("standard") == "standard"
    monkeypatch.setattr(layers, "DENSE_VJP", "standard")
    assert layers.dense_vjp_variant() == "standard"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert layers.dense_vjp_variant("auto") == "standard"
    with pytest.raises(ValueError, match="'auto', 'cpu', 'standard'"):
        layers.dense_vjp_variant("barrier")


def test_cpu_vjp_has_the_barrier_and_standard_has_none():
    x, w = np.ones((2, 4, 8), np.float32), np.ones((8, 16), np.float32)
    for variant, barrier in (("cpu", True), ("standard", False)):
        grad = jax.grad(lambda x, w, v=variant: layers.dense(x, w, vjp=v).sum(), argnums=1)
        assert ("optimization_barrier" in str(jax.make_jaxpr(grad)(x, w))) == barrier


@pytest.mark.parametrize(
    "x_shape,w_shape,n",
    [
        ((2, 8, 16), (16, 32), 1),
        ((2, 8, 4, 8), (4, 8, 16), 2),
        ((3, 5, 64), (64, 6, 8), 1),
        ((4, 128, 256), (256, 512), 1),
    ],
)
def test_both_vjps_give_the_same_numbers(x_shape, w_shape, n):
    x, w, g = _normal(0, x_shape, w_shape, x_shape[: len(x_shape) - n] + w_shape[n:])
    out = {}
    for variant in ("cpu", "standard"):
        y, vjp = jax.vjp(jax.jit(lambda x, w, v=variant: layers.dense(x, w, n, vjp=v)), x, w)
        out[variant] = (y,) + vjp(g)
    (y_cpu, dx_cpu, dw_cpu), (y_std, dx_std, dw_std) = out["cpu"], out["standard"]
    np.testing.assert_array_equal(y_cpu, y_std)
    if len(w_shape) == 2:
        np.testing.assert_array_equal(dx_cpu, dx_std)
    _close(dx_cpu, dx_std)
    _close(dw_cpu, dw_std)


def test_model_gradients_agree_both_ways(monkeypatch, tiny):
    """One encoder and one decoder layer hold every kind of dense the model has."""
    model = EncoderDecoderModel(tiny.t5_1_1.replace(num_encoder_layers=1, num_decoder_layers=1))
    params = tiny.random_params(model)
    tokens = tiny.random_tokens(0, (2, 8), tiny.t5_1_1.vocab_size)
    batch = {
        "encoder_input_tokens": tokens,
        "decoder_input_tokens": np.roll(tokens, 1, axis=1),
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": np.ones_like(tokens, np.float32),
    }
    grads = {}
    for variant in ("cpu", "standard"):
        monkeypatch.setattr(layers, "DENSE_VJP", variant)  # read when traced: a fresh jit each way
        value_and_grad = jax.value_and_grad(lambda p: model.loss_fn(p, batch)[0])
        barriers = str(jax.make_jaxpr(value_and_grad)(params)).count("optimization_barrier")
        assert (barriers > 0) == (variant == "cpu"), barriers  # every dense of the model follows the switch
        grads[variant] = jax.jit(value_and_grad)(params)
    np.testing.assert_array_equal(grads["cpu"][0], grads["standard"][0])
    jax.tree.map(_close, grads["cpu"][1], grads["standard"][1])


@pytest.mark.parametrize("x_shape,w_shape", [((4, 2, 5, 16), (4, 16, 32)), ((3, 40, 64), (3, 64, 24))])
def test_expert_dense_vjps_give_the_same_numbers(x_shape, w_shape):
    x, w, g = _normal(1, x_shape, w_shape, x_shape[:-1] + w_shape[-1:])
    out = {}
    for variant in ("cpu", "standard"):
        y, vjp = jax.vjp(jax.jit(lambda x, w, v=variant: layers.expert_dense(x, w, vjp=v)), x, w)
        out[variant] = (y,) + vjp(g)
    (y_cpu, dx_cpu, dw_cpu), (y_std, dx_std, dw_std) = out["cpu"], out["standard"]
    np.testing.assert_array_equal(y_cpu, y_std)
    _close(dx_cpu, dx_std)
    _close(dw_cpu, dw_std)
    assert y_cpu.shape == x_shape[:-1] + (w_shape[-1],)
