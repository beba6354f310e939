"""Adafactor factored by logical axis names (t5x's rules): which dims are factored, and update
values against a NumPy transcription of t5x's `apply_param_gradient` formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.trainer import OptimizerConfig, adafactor_axes, logical_factor_map, make_optimizer
from cairn.trainer.adafactor_axes import factor_rule, factor_rules, factored_dims

LR = 0.05


def _state(tx_state):
    return [s for s in jax.tree.leaves(tx_state, is_leaf=lambda x: hasattr(x, "v_row")) if hasattr(s, "v_row")][0]


def _scanned():
    """A scanned [layers=3, embed=4, mlp=6] kernel whose layers have very different scales."""
    rng = np.random.default_rng(0)
    scales = np.array([0.01, 1.0, 10.0])[:, None, None]
    param = (rng.normal(size=(3, 4, 6)) * scales).astype(np.float32)
    grads = [(rng.normal(size=(3, 4, 6)) * scales * (k + 1)).astype(np.float32) for k in range(3)]
    return param, grads


def _t5x_reference(param, grads, lr, decay_rate=0.8, clip=1.0, eps1=1e-30, eps2=1e-3):
    """t5x's update for rule (BATCH, ROW, COLUMN), in float64: per layer l,
    beta2_t = 1 - (t+1)^-0.8; v_row = beta2 v_row + (1-beta2) mean_mlp(g^2+eps1) [l, embed];
    v_col likewise over embed [l, mlp]; y = g / sqrt(v_row/mean_embed(v_row) * v_col);
    y /= max(1, rms_l(y)/clip); p -= lr * max(rms_l(p), eps2) * y."""
    p = param.astype(np.float64)
    v_row = np.zeros(p.shape[:2])
    v_col = np.zeros((p.shape[0], p.shape[2]))
    out = []
    for t, g in enumerate(grads):
        g = g.astype(np.float64)
        beta2 = 1.0 - (t + 1.0) ** -decay_rate
        g2 = g * g + eps1
        v_row = beta2 * v_row + (1 - beta2) * g2.mean(axis=2)
        v_col = beta2 * v_col + (1 - beta2) * g2.mean(axis=1)
        row_factor = (v_row / v_row.mean(axis=1, keepdims=True)) ** -0.5
        col_factor = v_col**-0.5
        y = g * row_factor[:, :, None] * col_factor[:, None, :]
        y = y / np.maximum(1.0, np.sqrt((y * y).mean(axis=(1, 2), keepdims=True)) / clip)
        scale = lr * np.maximum(np.sqrt((p * p).mean(axis=(1, 2), keepdims=True)), eps2)
        p = p - scale * y
        out.append(p.copy())
    return out, v_row, v_col


def _run(tx, param, grads, key="kernel"):
    """`tx`'s steps on `param`, each a compiled program (op by op, each of the optimizer's
    operations would compile one of its own: about ten times the CPU)."""

    def step(g, state, params):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    params = {key: jnp.asarray(param)}
    state, step = jax.jit(tx.init)(params), jax.jit(step)
    out = []
    for g in grads:
        params, state = step({key: jnp.asarray(g)}, state, params)
        out.append(np.asarray(params[key]))
    return out, state


def test_scanned_kernel_is_factored_per_layer_never_over_layers():
    fmap = logical_factor_map({"kernel": ("layers", "embed", "mlp")})
    assert fmap == {"kernel": ("batch", "row", "column")}
    param, grads = _scanned()
    tx = adafactor_axes(LR, fmap)
    st = _state(jax.eval_shape(tx.init, {"kernel": jnp.asarray(param)}))
    assert st.v_row["kernel"].shape == (3, 4) and st.v_col["kernel"].shape == (3, 6)
    assert st.v["kernel"].shape == (1,)


def test_scanned_updates_match_t5x_formulas_for_three_steps():
    param, grads = _scanned()
    tx = adafactor_axes(LR, logical_factor_map({"kernel": ("layers", "embed", "mlp")}))
    ours, state = _run(tx, param, grads)
    ref, v_row, v_col = _t5x_reference(param, grads, LR)
    for step, (a, b) in enumerate(zip(ours, ref)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7, err_msg=f"step {step + 1}")
    st = _state(state)
    np.testing.assert_allclose(np.asarray(st.v_row["kernel"]), v_row, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(st.v_col["kernel"]), v_col, rtol=1e-5)
    # Per-layer statistics matter: averaging the parameter scale over all layers would not match.
    assert np.abs(ours[0][0] - param[0]).max() < 1e-3 * np.abs(ours[0][2] - param[2]).max()


def test_scanned_equals_each_layer_unscanned():
    """A scanned param trains as its layers would unscanned ([embed, mlp] kernels, factored by
    the heuristic once min_dim_size_to_factor allows)."""
    param, grads = _scanned()
    scanned, _ = _run(adafactor_axes(LR, logical_factor_map({"k": ("layers", "embed", "mlp")})), param, grads, "k")
    for layer in range(3):
        tx = adafactor_axes(LR, logical_factor_map({"k": ("embed", "mlp")}), min_dim_size_to_factor=4)
        alone, _ = _run(tx, param[layer], [g[layer] for g in grads], "k")
        np.testing.assert_allclose(scanned[-1][layer], alone[-1], rtol=1e-5, atol=1e-8)


def test_attention_heads_are_batch_like_and_t5x_rules_can_be_restored():
    axes = {"query": ("embed", "heads", "kv"), "out": ("heads", "kv", "embed"), "relpos": ("heads", "relpos_buckets")}
    params = {"query": jnp.ones((8, 2, 4)), "out": jnp.ones((2, 4, 8)), "relpos": jnp.ones((2, 32))}
    st = _state(jax.eval_shape(adafactor_axes(LR, logical_factor_map(axes)).init, params))
    assert st.v_row["query"].shape == (8, 2) and st.v_col["query"].shape == (2, 4)
    assert st.v_row["out"].shape == (2, 8) and st.v_col["out"].shape == (2, 4)
    assert st.v["relpos"].shape == (2, 32)  # batch + none: not factored, statistics per head
    t5x = logical_factor_map(axes, factor_rules({"heads": "column"}))
    st = _state(jax.eval_shape(adafactor_axes(LR, t5x).init, params))
    assert st.v_row["query"].shape == (8,) and st.v_col["query"].shape == (2, 4)


def test_two_dim_params_fall_back_to_the_heuristic_with_min_dim_size():
    rule = factor_rule(("vocab", "embed"), factor_rules())
    assert factored_dims(rule, (256, 128)) == ((0, 1), ((1,), (0,)))
    assert factored_dims(rule, (256, 64)) == ((0, 1), None)  # 64 < 128
    assert factored_dims(rule, (256, 64), min_dim_size_to_factor=64) == ((0, 1), ((1,), (0,)))
    assert factored_dims(("batch", "none"), (3, 512)) == ((1,), None)  # a scanned norm scale
    assert factored_dims(("batch", "row", "column"), (3, 4, 6), factored=False) == ((1, 2), None)


def test_options_decay_rate_clipping_and_parameter_scale():
    param, grads = _scanned()
    fmap = logical_factor_map({"kernel": ("layers", "embed", "mlp")})
    ours, _ = _run(adafactor_axes(LR, fmap, decay_rate=0.5, clipping_threshold=0.3), param, grads)
    ref, _, _ = _t5x_reference(param, grads, LR, decay_rate=0.5, clip=0.3)
    np.testing.assert_allclose(ours[-1], ref[-1], rtol=2e-5, atol=1e-7)
    plain, _ = _run(
        adafactor_axes(LR, fmap, multiply_by_parameter_scale=False, clipping_threshold=None), param, grads[:1]
    )
    step = (param - plain[0]) / LR  # g / sqrt(v): at step 1 the factored estimate of |g|
    g = grads[0].astype(np.float64)
    v_row, v_col = (g * g).mean(axis=2), (g * g).mean(axis=1)
    want = g / np.sqrt(v_row[:, :, None] * v_col[:, None, :] / v_row.mean(axis=1)[:, None, None])
    np.testing.assert_allclose(step, want, rtol=1e-4, atol=1e-4)  # float32 p - (p - lr*y)


def test_bad_rules_name_the_axis_or_parameter():
    with pytest.raises(ValueError, match="'widgets'.*'p'|'widgets' of parameter p"):
        logical_factor_map({"p": ("embed", "widgets")})
    with pytest.raises(ValueError, match="incomplete.*q"):
        logical_factor_map({"q": ("embed", "mlp", None)})
    with pytest.raises(ValueError, match="'heads'.*'diagonal'"):
        factor_rules({"heads": "diagonal"})
    with pytest.raises(ValueError, match="param_axes"):
        make_optimizer(OptimizerConfig(factoring="logical"), 0.1)
    with pytest.raises(ValueError, match="factoring"):
        OptimizerConfig(factoring="largest")
