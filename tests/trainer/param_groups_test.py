"""The weight-decay mask, frozen parameters and per-group learning rates, by regex on paths."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.trainer import DEFAULT_NO_DECAY, OptimizerConfig, ParamGroup, make_optimizer
from cairn.trainer.param_groups import group_label, param_paths, unmatched


def _params():
    rng = np.random.default_rng(0)
    return {
        "token_embedder": {"embedding": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)},
        "encoder": {
            "layer_norm": {"scale": jnp.ones((8,))},
            "mlp": {"wi": {"kernel": jnp.asarray(rng.normal(size=(8, 12)), jnp.float32), "bias": jnp.ones((12,))}},
        },
        "decoder": {"logits": {"kernel": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)}},
    }


def _first_update(tx, grads, params):
    """The first update of `tx` from its initial state, as one compiled program (op by op,
    each of the optimizer's operations compiles a program of its own: ten times the CPU)."""
    return jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)


def _update(config, grads=None, lr=0.1, params=None):
    params = params or _params()
    grads = grads if grads is not None else jax.tree.map(jnp.ones_like, params)
    updates = _first_update(make_optimizer(config, lr), grads, params)
    return {p: np.asarray(u) for p, u in zip(param_paths(updates), jax.tree.leaves(updates))}


def test_paths_and_default_no_decay_mask():
    paths = param_paths(_params())
    assert "encoder/mlp/wi/kernel" in paths and "token_embedder/embedding" in paths
    zero = jax.tree.map(jnp.zeros_like, _params())
    for name in ("adamw", "adafactor"):
        up = _update(OptimizerConfig(name=name, weight_decay=0.01), grads=zero)
        for path in ("token_embedder/embedding", "encoder/layer_norm/scale", "encoder/mlp/wi/bias"):
            assert not up[path].any(), (name, path)
        for path in ("encoder/mlp/wi/kernel", "decoder/logits/kernel"):
            assert np.abs(up[path]).min() > 0, (name, path)
    assert DEFAULT_NO_DECAY == (r"(^|/)(scale|bias|embedding)$",)
    everything = _update(OptimizerConfig(name="adamw", weight_decay=0.01, no_decay=()), grads=zero)
    assert np.abs(everything["encoder/layer_norm/scale"]).min() > 0


def test_frozen_params_get_zero_updates_and_no_state():
    cfg = OptimizerConfig(name="adamw", freeze=("^encoder/",))
    up = _update(cfg)
    assert not up["encoder/mlp/wi/kernel"].any() and not up["encoder/layer_norm/scale"].any()
    assert np.abs(up["decoder/logits/kernel"]).min() > 0
    params = _params()
    state = jax.eval_shape(make_optimizer(cfg, 0.1).init, params)  # the shapes are what is checked
    sizes = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))
    trainable = sum(
        int(np.prod(x.shape)) for p, x in zip(param_paths(params), jax.tree.leaves(params)) if "encoder" not in p
    )
    assert sizes <= 2 * trainable + 8  # mu and nu of the trainable params only (+ counts)


def test_frozen_gradients_do_not_count_in_the_global_norm():
    params = _params()
    grads = jax.tree.map(jnp.ones_like, params)
    grads["encoder"]["mlp"]["wi"]["kernel"] = jnp.full((8, 12), 1e6)
    frozen = _update(OptimizerConfig(name="adamw", clip_grad_norm=1.0, freeze=("encoder/mlp",)), grads=grads)
    grads["encoder"]["mlp"]["wi"]["kernel"] = jnp.zeros((8, 12))
    grads["encoder"]["mlp"]["wi"]["bias"] = jnp.zeros((12,))
    plain = _update(OptimizerConfig(name="adamw", clip_grad_norm=1.0), grads=grads, lr=0.1)
    np.testing.assert_allclose(frozen["decoder/logits/kernel"], plain["decoder/logits/kernel"], rtol=1e-6)


def test_a_group_gets_its_own_learning_rate():
    groups = (ParamGroup("logits", 0.1), ParamGroup("decoder|encoder", 2.0))
    for name in ("adamw", "adafactor"):
        base = _update(OptimizerConfig(name=name))
        up = _update(OptimizerConfig(name=name, groups=groups))
        np.testing.assert_allclose(up["decoder/logits/kernel"], 0.1 * base["decoder/logits/kernel"], rtol=1e-5)
        np.testing.assert_allclose(up["encoder/mlp/wi/kernel"], 2.0 * base["encoder/mlp/wi/kernel"], rtol=1e-5)
        np.testing.assert_allclose(up["token_embedder/embedding"], base["token_embedder/embedding"], rtol=1e-6)


def test_labels_freeze_first_then_first_matching_group():
    groups = (ParamGroup("kernel", 0.5), ParamGroup("logits", 3.0))
    assert group_label("encoder/mlp/wi/kernel", ("encoder",), groups) == "frozen"
    assert group_label("decoder/logits/kernel", (), groups) == "group_0"
    assert group_label("token_embedder/embedding", (), groups) == "default"


def test_unmatched_and_bad_patterns():
    paths = param_paths(_params())
    assert unmatched(["logits", "^decoder/mlp", "embedding$"], paths) == ["^decoder/mlp"]
    with pytest.raises(ValueError, match=r"invalid parameter pattern '\(oops'"):
        OptimizerConfig(freeze=("(oops",))
    with pytest.raises(ValueError, match="learning_rate_scale"):
        ParamGroup("x", 0.0)
    with pytest.raises(ValueError, match=r"'\[a'"):
        ParamGroup("[a")


def test_logical_factoring_with_groups_inside_multi_transform():
    params = {"layers": {"wi": jnp.ones((2, 8, 12)), "scale": jnp.ones((2, 8))}, "head": jnp.ones((8, 4))}
    axes = {"layers": {"wi": ("layers", "embed", "mlp"), "scale": ("layers", "embed")}, "head": ("embed", "vocab")}
    cfg = OptimizerConfig(factoring="logical", freeze=("head",), groups=(ParamGroup("scale", 0.5),))
    tx = make_optimizer(cfg, 0.1, param_axes=axes)
    state = jax.eval_shape(tx.init, params)  # the shapes are what is checked
    rows = [
        s
        for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.FactoredState))
        if isinstance(s, optax.FactoredState)
    ]
    shapes = sorted(tuple(x.shape) for s in rows for x in jax.tree.leaves(s.v_row))
    assert (2, 8) in shapes  # wi's per-layer row statistics
    updates = _first_update(tx, jax.tree.map(jnp.ones_like, params), params)
    assert not np.asarray(updates["head"]).any() and np.asarray(updates["layers"]["wi"]).all()
