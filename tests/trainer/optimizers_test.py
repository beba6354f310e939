"""Adafactor with T5's settings, AdamW, global-norm clipping.

The optimizers run as compiled programs (jax.jit): op by op, each of their operations would
compile a program of its own, about ten times the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.trainer import OptimizerConfig, adafactor_t5, make_optimizer


def _params():
    k = np.random.default_rng(0).standard_normal((256, 128), np.float32) * 0.1
    return {"kernel": jnp.asarray(k), "bias": jnp.ones((64,)) * 0.5}


def _first_update(tx, grads, params):
    """`tx`'s first update from its initial state, and that state after it."""
    return jax.jit(lambda g, p: tx.update(g, tx.init(p), p))(grads, params)


def _factored_state(state):
    return [s for s in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "v_row")) if hasattr(s, "v_row")][0]


def test_adafactor_factors_large_matrices_only():
    params = _params()
    state = _factored_state(jax.eval_shape(adafactor_t5(0.01).init, params))
    assert {state.v_row["kernel"].shape, state.v_col["kernel"].shape} == {(256,), (128,)}
    assert state.v["kernel"].shape == (1,)
    assert state.v["bias"].shape == (64,)  # 1-D: not factored


def test_adafactor_first_step_matches_t5_formula():
    """First step, decay 0.8: beta2 = 1 - (t+1)^-0.8 = 0 at t=0, so v = g^2 (+eps); the update
    g / sqrt(v) is then clipped to RMS 1 and scaled by lr * max(rms(param), 1e-3)."""
    params = {"bias": jnp.array([0.5, -0.5, 2.0, 1.0])}
    grads = {"bias": jnp.array([0.1, -0.2, 0.3, 0.0])}
    lr = 0.01
    updates, _ = _first_update(adafactor_t5(lr), grads, params)
    g = np.asarray(grads["bias"], np.float64)
    u = g / np.sqrt(g**2 + 1e-30)
    u = u / max(1.0, np.sqrt(np.mean(u**2)) / 1.0)
    param_scale = max(np.sqrt(np.mean(np.asarray(params["bias"]) ** 2)), 1e-3)
    np.testing.assert_allclose(np.asarray(updates["bias"]), -lr * param_scale * u, rtol=1e-5)


def test_adafactor_has_no_momentum_and_decay_08():
    tx = adafactor_t5(0.01)
    state = jax.eval_shape(tx.init, _params())
    leaves = [x for x in jax.tree.leaves(state) if hasattr(x, "shape")]
    total = sum(int(np.prod(x.shape)) for x in leaves)
    assert total < 256 * 128  # no full-size first moment
    # Second step: v_row decays with beta2 = 1 - 2^-0.8.
    p = {"bias": jnp.ones((4,))}
    g1, g2 = {"bias": jnp.full((4,), 1.0)}, {"bias": jnp.full((4,), 2.0)}
    _, st = _first_update(tx, g1, p)
    _, st = jax.jit(tx.update)(g2, st, p)
    beta2 = 1 - 2.0**-0.8
    np.testing.assert_allclose(np.asarray(_factored_state(st).v["bias"]), beta2 * 1 + (1 - beta2) * 4, rtol=1e-5)


def test_adamw_matches_optax_and_clipping_clips():
    params = _params()
    grads = jax.tree.map(lambda p: jnp.full_like(p, 100.0), params)
    cfg = OptimizerConfig(name="adamw", weight_decay=0.01, clip_grad_norm=1.0, no_decay=())
    ours, _ = _first_update(make_optimizer(cfg, 1e-3), grads, params)
    ref_tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    ref, _ = _first_update(ref_tx, grads, params)
    jax.tree.map(np.testing.assert_allclose, ours, ref)
    clipped, _ = _first_update(optax.clip_by_global_norm(1.0), grads, params)
    assert float(optax.tree.norm(clipped)) == pytest.approx(1.0, rel=1e-5)


def test_bad_optimizer_config_names_allowed_values():
    with pytest.raises(ValueError, match="adafactor.*adamw.*'sgd'"):
        OptimizerConfig(name="sgd")
    with pytest.raises(ValueError, match="clip_grad_norm"):
        OptimizerConfig(clip_grad_norm=0.0)
