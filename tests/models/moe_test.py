"""`cairn.models.moe` and `moe_config`: routing by hand (token choice's priority order and
capacity, expert choice), the auxiliary losses, `MoeMlp` against a dense MLP, dropped tokens,
jitter, config validation, and the model-level loss with routed layers."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import DecoderOnlyModel, EncoderDecoderModel, LlamaConfig, T5Config, get_preset
from cairn.models.model_base import loss_and_metrics
from cairn.models.moe import MoeMlp, expert_choice, load_balance_loss, moe_losses, router_z_loss, token_choice
from cairn.models.moe_config import MoeConfig, as_moe_config

# One routing group of 4 tokens over 3 experts. Top 2 of each token (first, second):
# t0: e0 (.6), e1 (.3); t1: e1 (.7), e0 (.2); t2: e1 (.5), e2 (.4); t3: e0 (.5), e2 (.45).
PROBS = np.array([[[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.5, 0.4], [0.5, 0.05, 0.45]]], np.float32)


def _slots(entries, t=4, e=3, c=2):
    """`[1, t, e, c]` with `value` at each `(token, expert, slot, value)`."""
    out = np.zeros((1, t, e, c), np.float32)
    for token, expert, slot, value in entries:
        out[0, token, expert, slot] = value
    return out


# Routing compiled once per (shape, k, capacity, renormalize): op by op, each of its operations
# would compile its own.
_token_choice = jax.jit(token_choice, static_argnums=(1, 2, 3))
_expert_choice = jax.jit(expert_choice, static_argnums=1)


def _route(probs, k, capacity, renormalize):
    return [np.asarray(a) for a in _token_choice(jnp.asarray(probs), k, capacity, renormalize)]


def test_token_choice_first_choices_before_second_choices():
    # First choices in token order: t0 -> e0 slot 0, t1 -> e1 slot 0, t2 -> e1 slot 1, t3 -> e0 slot 1.
    # Then second choices: t0 -> e1 and t1 -> e0 find their expert full (dropped, although
    # t0 and t1 come before t2 and t3 in the row); t2 -> e2 slot 0, t3 -> e2 slot 1.
    dispatch, combine, index, dropped = _route(PROBS, 2, 2, renormalize=True)
    kept = [(0, 0, 0, 0.6 / 0.9), (1, 1, 0, 0.7 / 0.9), (2, 1, 1, 0.5 / 0.9), (2, 2, 0, 0.4 / 0.9)]
    kept += [(3, 0, 1, 0.5 / 0.95), (3, 2, 1, 0.45 / 0.95)]
    np.testing.assert_array_equal(dispatch, _slots([(t, e, c, 1.0) for t, e, c, _ in kept]))
    np.testing.assert_allclose(combine, _slots(kept), rtol=1e-6)
    np.testing.assert_array_equal(index, [[[0, 1], [1, 0], [1, 2], [0, 2]]])
    assert dropped == pytest.approx(2 / 8)
    # Without renormalisation the weights are the router probabilities.
    _, raw, _, _ = _route(PROBS, 2, 2, renormalize=False)
    np.testing.assert_allclose(raw, _slots([(t, e, c, PROBS[0, t, e]) for t, e, c, _ in kept]), rtol=1e-6)


def test_token_choice_with_room_for_everything():
    dispatch, combine, _, dropped = _route(PROBS, 2, 4, renormalize=True)
    # e0: t0, t3 (first choices), then t1 (second); e1: t1, t2, then t0; e2: t2, t3 (second choices).
    slots = [(0, 0, 0), (3, 0, 1), (1, 0, 2), (1, 1, 0), (2, 1, 1), (0, 1, 2), (2, 2, 0), (3, 2, 1)]
    np.testing.assert_array_equal(dispatch, _slots([(t, e, c, 1.0) for t, e, c in slots], c=4))
    assert dropped == 0.0
    # Every token's weights sum to 1 (renormalised top 2).
    np.testing.assert_allclose(combine.sum(axis=(2, 3)), np.ones((1, 4)), rtol=1e-6)


def test_top_1_switch_routing():
    # Capacity 1: t0 takes e0, t1 takes e1; t2 (e1) and t3 (e0) are dropped.
    dispatch, combine, index, dropped = _route(PROBS, 1, 1, renormalize=False)
    np.testing.assert_array_equal(index, [[[0], [1], [1], [0]]])
    np.testing.assert_array_equal(dispatch, _slots([(0, 0, 0, 1.0), (1, 1, 0, 1.0)], c=1))
    np.testing.assert_allclose(combine, _slots([(0, 0, 0, 0.6), (1, 1, 0, 0.7)], c=1), rtol=1e-6)
    assert dropped == pytest.approx(0.5)
    # Renormalised top 1: weight 1.
    _, ones, _, _ = _route(PROBS, 1, 1, renormalize=True)
    np.testing.assert_allclose(ones, _slots([(0, 0, 0, 1.0), (1, 1, 0, 1.0)], c=1), rtol=1e-6)


def test_capacity_is_per_group():
    # Two groups routed together are routed as each alone (the second in reverse token order:
    # now t3 and t2 come first, and the drops differ).
    both = np.concatenate([PROBS, PROBS[:, ::-1]])
    together = _route(both, 2, 2, renormalize=True)
    for g in range(2):
        alone = _route(both[g : g + 1], 2, 2, renormalize=True)
        for a, b in zip(together[:3], alone[:3]):
            np.testing.assert_allclose(a[g : g + 1], b, rtol=1e-6)
    # Reversed: t3 -> e0, t2 -> e1, t1 -> e1, t0 -> e0 fill both experts, then t3 -> e2 and
    # t2 -> e2 are kept, t1 -> e0 and t0 -> e1 dropped: again 2 of 8, with the same tokens losing.
    assert together[3] == pytest.approx(2 / 8)


def test_expert_choice_each_expert_takes_its_best_tokens():
    dispatch, combine, dropped = (np.asarray(a) for a in _expert_choice(jnp.asarray(PROBS), 1))
    # e0's column (.6, .2, .1, .5) -> t0; e1's (.3, .7, .5, .05) -> t1; e2's (.1, .1, .4, .45) -> t3.
    taken = [(0, 0, 0, 0.6), (1, 1, 0, 0.7), (3, 2, 0, 0.45)]
    np.testing.assert_array_equal(dispatch, _slots([(t, e, c, 1.0) for t, e, c, _ in taken], c=1))
    np.testing.assert_allclose(combine, _slots(taken, c=1), rtol=1e-6)
    assert dropped == pytest.approx(1 / 4)  # t2: chosen by nobody
    dispatch, combine, dropped = (np.asarray(a) for a in _expert_choice(jnp.asarray(PROBS), 2))
    # Two each: e0 t0, t3; e1 t1, t2; e2 t3, t2 (t3 goes to two experts; nobody is left out).
    taken = [(0, 0, 0), (3, 0, 1), (1, 1, 0), (2, 1, 1), (3, 2, 0), (2, 2, 1)]
    np.testing.assert_array_equal(dispatch, _slots([(t, e, c, 1.0) for t, e, c in taken]))
    np.testing.assert_allclose(combine, _slots([(t, e, c, PROBS[0, t, e]) for t, e, c in taken]), rtol=1e-6)
    assert dropped == 0.0


def test_load_balance_loss():
    # Uniform router, each of 4 experts the top-1 choice of one of 4 tokens: 1.
    uniform = jnp.full((1, 4, 4), 0.25)
    assert float(load_balance_loss(uniform, jnp.arange(4).reshape(1, 4, 1))) == pytest.approx(1.0)
    # Every token on expert 0 with all the probability there: num_experts.
    collapsed = jnp.zeros((1, 4, 4)).at[:, :, 0].set(1.0)
    assert float(load_balance_loss(collapsed, jnp.zeros((1, 4, 1), jnp.int32))) == pytest.approx(4.0)
    # PROBS, top 2: e0 chosen by t0, t1, t3 (f = 3/4), e1 by t0, t1, t2 (3/4), e2 by t2, t3 (2/4);
    # mean probabilities .35, .3875, .2625. Loss: E * sum_e f_e * p_e.
    index = jnp.array([[[0, 1], [1, 0], [1, 2], [0, 2]]])
    expected = 3 * (0.75 * 0.35 + 0.75 * 0.3875 + 0.5 * 0.2625)
    assert float(load_balance_loss(jnp.asarray(PROBS), index)) == pytest.approx(expected, rel=1e-6)
    # Averaged over groups.
    two = jnp.concatenate([jnp.asarray(PROBS), collapsed[:, :, :3]])
    index2 = jnp.concatenate([index, jnp.zeros((1, 4, 2), jnp.int32).at[..., 1].set(1)])
    lb_collapsed = 3 * (1.0 * 1.0 + 1.0 * 0.0 + 0.0)  # f = (1, 1, 0), p = (1, 0, 0)
    assert float(load_balance_loss(two, index2)) == pytest.approx((expected + lb_collapsed) / 2, rel=1e-6)


def test_router_z_loss():
    # logsumexp([0, 0]) = ln 2, logsumexp([ln 3, 0]) = ln 4 = 2 ln 2: mean square 2.5 (ln 2)^2.
    logits = jnp.array([[[0.0, 0.0], [np.log(3.0), 0.0]]])
    assert float(router_z_loss(logits)) == pytest.approx(2.5 * np.log(2.0) ** 2, rel=1e-6)


# --- MoeMlp ---------------------------------------------------------------------------------

EMB, MLP = 8, 16


def _x(seed=0, shape=(2, 6, EMB)):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


def _dense(x, kernels, activations):
    """The dense MLP `act0(x Wi0) * act1(x Wi1) Wo` (one activation: `act(x Wi) Wo`)."""
    fns = {"silu": jax.nn.silu, "relu": jax.nn.relu, "linear": lambda v: v}
    h = None
    for w, act in zip(kernels[:-1], activations):
        y = fns[act](x @ w)
        h = y if h is None else h * y
    return h @ kernels[-1]


def _init(module, x, std=1.0):
    """Parameters of `module`'s tree drawn with numpy, normal(0, std) (the values these tests
    need are set by hand or any; a jitted init's random-number program costs a compile)."""
    shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(1), x)["params"])
    rng = np.random.default_rng(1)
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32) * std), shapes)


def _apply(module, params, x, **kwargs):
    """`module.apply` as one compiled program (op by op, each operation compiles its own)."""
    return jax.jit(functools.partial(module.apply, **kwargs))({"params": params}, x)


@pytest.mark.parametrize(
    "activations,moe",
    [
        (("silu", "linear"), MoeConfig(num_experts=4, top_k=2, dropless=True)),
        (("relu",), MoeConfig(num_experts=4, top_k=3, capacity_factor=4.0)),  # capacity: the whole group
    ],
)
def test_identical_experts_give_the_dense_mlp(activations, moe):
    x = _x()
    module = MoeMlp(moe, MLP, activations, router_stddev=1.0)
    params = _init(module, x)  # the router: normal(0, 1), as router_stddev=1.0 draws it
    names = ["wi"] if len(activations) == 1 else ["wi_0", "wi_1"]
    rng = np.random.default_rng(2)
    shapes = [(EMB, MLP)] * len(names) + [(MLP, EMB)]
    kernels = [0.3 * rng.standard_normal(shape, np.float32) for shape in shapes]
    for name, w in zip(names + ["wo"], kernels):
        assert params[name]["kernel"].shape == (4,) + w.shape
        params[name]["kernel"] = jnp.broadcast_to(w, (4,) + w.shape)
    out, state = _apply(module, params, x, mutable=["moe"])
    np.testing.assert_allclose(out, _dense(x, kernels, activations), rtol=1e-5, atol=1e-5)
    assert float(state["moe"]["dropped_fraction"][0]) == 0.0
    # The routing was not trivial: the router spreads tokens over several experts.
    probs = jax.nn.softmax(x @ params["router"]["kernel"])
    assert len(np.unique(np.asarray(jnp.argmax(probs, -1)))) > 1


def test_dropped_tokens_get_no_mlp_output():
    # Every token prefers expert 0 (the router reads x's first feature, kept positive); top 1
    # with capacity ceil(1.0 * 6 / 4) = 2: the first two tokens of each row pass, four do not.
    x = _x().at[..., 0].set(1.0)
    moe = MoeConfig(num_experts=4, top_k=1, capacity_factor=1.0)
    module = MoeMlp(moe, MLP)
    params = _init(module, x, std=0.02)
    params["router"]["kernel"] = jnp.zeros((EMB, 4)).at[0, 0].set(10.0)
    out, state = _apply(module, params, x, mutable=["moe"])
    assert moe.capacity(6) == 2
    np.testing.assert_array_equal(out[:, 2:], 0.0)
    kernels = [params[n]["kernel"][0] for n in ("wi_0", "wi_1", "wo")]
    np.testing.assert_allclose(out[:, :2], _dense(x[:, :2], kernels, ("silu", "linear")), rtol=1e-5, atol=1e-6)
    assert float(state["moe"]["dropped_fraction"][0]) == pytest.approx(4 / 6)


def test_jitter_noise_only_when_training_and_deterministic_given_the_rng():
    x = _x()
    moe = MoeConfig(num_experts=4, top_k=2, jitter_noise=0.5, dropless=True)

    compiled = {}  # one program per (deterministic, config): op by op, each operation compiles its own

    def run(deterministic, seed=None, config=moe, params=None):
        if (deterministic, config) not in compiled:
            module = MoeMlp(config, MLP, router_stddev=1.0, deterministic=deterministic)
            compiled[deterministic, config] = jax.jit(lambda p, rngs: module.apply({"params": p}, x, rngs=rngs))
        rngs = None if seed is None else {"dropout": jax.random.PRNGKey(seed)}
        return np.asarray(compiled[deterministic, config](params, rngs))

    params = _init(MoeMlp(moe, MLP, router_stddev=1.0), x)
    quiet = run(True, config=moe.replace(jitter_noise=0.0), params=params)
    np.testing.assert_array_equal(run(True, params=params), quiet)  # evaluation: no noise
    noisy = run(False, 3, params=params)
    assert np.abs(noisy - quiet).max() > 1e-4
    np.testing.assert_array_equal(run(False, 3, params=params), noisy)  # same rng, same noise
    assert np.abs(run(False, 4, params=params) - noisy).max() > 1e-4
    # The noise multiplies the router's input only: a router that ignores its input (all-zero
    # kernel, uniform probabilities) makes the jittered layer equal to the quiet one.
    flat = {**params, "router": {"kernel": jnp.zeros_like(params["router"]["kernel"])}}
    np.testing.assert_allclose(run(False, 3, params=flat), run(True, params=flat), rtol=1e-6, atol=1e-7)


# --- MoeConfig ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: MoeConfig(num_experts=4, top_k=5), r"moe\.top_k \(5\) must be <= moe\.num_experts \(4\)"),
        (lambda: MoeConfig(capacity_factor=0), r"moe\.capacity_factor must be a positive number"),
        (lambda: MoeConfig(capacity_factor=-1.0), r"moe\.capacity_factor"),
        (lambda: MoeConfig(num_experts=0), r"moe\.num_experts must be a positive int"),
        (lambda: MoeConfig(routing="hash"), r"moe\.routing must be one of"),
        (lambda: MoeConfig(jitter_noise=1.0), r"moe\.jitter_noise"),
        (lambda: MoeConfig(router_z_loss_weight=-1.0), r"moe\.router_z_loss_weight"),
        (lambda: MoeConfig(expert_mlp_dim=0), r"moe\.expert_mlp_dim"),
        (lambda: as_moe_config({"num_experts": 4, "experts_per_token": 2}), r"unknown keys \['experts_per_token'\]"),
        (lambda: LlamaConfig(moe={"top_k": 9}), r"moe\.top_k \(9\)"),
        (lambda: LlamaConfig(moe=MoeConfig(every=2), scan_layers=True), r"moe\.every > 1 needs scan_layers=False"),
        (lambda: T5Config(moe="mixtral"), r"moe must be None, a MoeConfig or a mapping"),
    ],
)
def test_config_errors_name_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_config_from_a_mapping_and_capacity():
    c = LlamaConfig(moe={"num_experts": 4, "top_k": 1, "every": 2})
    assert c.moe == MoeConfig(num_experts=4, top_k=1, every=2)
    assert [c.moe.is_sparse(i) for i in range(4)] == [False, True, False, True]
    assert MoeConfig(num_experts=8, top_k=2, capacity_factor=1.25).capacity(10) == 4  # ceil(1.25 * 10 * 2 / 8)
    assert MoeConfig(num_experts=8, top_k=2, dropless=True).capacity(10) == 10
    assert MoeConfig(num_experts=64, top_k=1, capacity_factor=0.1).capacity(10) == 1  # at least one
    assert MoeConfig(routing="expert_choice", num_experts=4, top_k=2, capacity_factor=2.0).capacity(10) == 5


# --- The model-level loss -------------------------------------------------------------------


def _batch(vocab, shape=(2, 8), seed=0):
    rng = np.random.default_rng(seed)
    targets = rng.integers(2, vocab, size=shape).astype(np.int32)
    inputs = np.concatenate([np.zeros((shape[0], 1), np.int32), targets[:, :-1]], axis=1)
    return {"decoder_input_tokens": inputs, "decoder_target_tokens": targets}


def test_loss_adds_the_weighted_router_losses_and_reaches_the_router(tiny):
    # Scanned (every layer is routed): one layer's program to compile, the layers on axis 0.
    model = DecoderOnlyModel(get_preset("mixtral_tiny", scan_layers=True))
    # Drawn as the init draws them (every kernel normal(0, init_std), norm scales 1), with
    # numpy: the init's random-number program is not compiled.
    params = tiny.random_params(model, std=model.config.init_std)
    batch = _batch(256)
    aux_loss = lambda p: model.loss_fn(p, batch)[1]["moe/aux_loss"]

    @jax.jit
    def run(p):
        # The plain cross-entropy of the logits too (in the one program: op by op, each of its
        # operations would compile its own).
        ce = loss_and_metrics(model.apply(p, batch), batch, 0.0, model.z_loss, None)[0]
        return jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch), ce, jax.grad(aux_loss)(p)

    ((loss, metrics), grads), ce, aux_grads = run(params)
    assert {"moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/aux_loss"} <= set(metrics)
    moe = model.config.moe
    aux = (
        moe.load_balance_loss_weight * metrics["moe/load_balance_loss"]
        + moe.router_z_loss_weight * metrics["moe/router_z_loss"]
    )
    assert float(metrics["moe/aux_loss"]) == pytest.approx(float(aux), rel=1e-6)
    # Top 2 of 4 experts at initialisation: near 2 (the uniform value for top 2), z-loss near (ln 4)^2.
    assert 1.5 < float(metrics["moe/load_balance_loss"]) < 2.5
    assert float(metrics["moe/router_z_loss"]) == pytest.approx(np.log(4.0) ** 2, rel=0.15)
    assert float(loss) == pytest.approx(float(ce + metrics["moe/aux_loss"]), rel=1e-6)
    assert float(metrics["loss"]) == float(loss)
    assert float(loss) == pytest.approx(
        float(metrics["cross_ent_loss"] + metrics["z_loss"] + metrics["moe/aux_loss"]), rel=1e-6
    )
    routers = np.asarray(grads["layers"]["mlp"]["router"]["kernel"])
    assert routers.shape[0] == 2 and all(np.abs(routers[i]).max() > 0 for i in range(2))
    # The auxiliary losses have their own gradient on the routers (and none on the last
    # layer's experts, which no router reads).
    aux_routers = np.asarray(aux_grads["layers"]["mlp"]["router"]["kernel"])
    assert all(np.abs(aux_routers[i]).max() > 0 for i in range(2))
    assert float(np.abs(np.asarray(aux_grads["layers"]["mlp"]["wo"]["kernel"])[1]).max()) == 0.0


def test_st_moe_routes_every_second_layer_of_encoder_and_decoder(tiny):
    config = get_preset("st_moe_tiny", vocab_size=67)
    model = EncoderDecoderModel(config)
    params = tiny.random_params(model, std=0.05)  # the init's tree; numpy-drawn values
    assert "router" in params["encoder"]["layers_1"]["mlp"] and "router" in params["decoder"]["layers_1"]["mlp"]
    assert "router" not in params["encoder"]["layers_0"]["mlp"] and "router" not in params["decoder"]["layers_0"]["mlp"]
    assert params["encoder"]["layers_1"]["mlp"]["wi_0"]["kernel"].shape == (4, 128, 256)
    batch = {**_batch(67, (2, 6), seed=1), "encoder_input_tokens": _batch(67, (2, 10), seed=2)["decoder_target_tokens"]}
    logits, sown, (loss, m) = jax.jit(lambda p: (*model.apply_with_aux(p, batch), model.loss_fn(p, batch)))(params)
    assert logits.shape == (2, 6, 67)
    routed = sorted(f"{stack}/{layer}" for stack in sown for layer in sown[stack])
    assert routed == ["decoder/layers_1", "encoder/layers_1"]
    metrics = moe_losses(sown, config.moe)
    # The metrics are the mean over the routed layers.
    lb = [float(sown[s]["layers_1"]["mlp"]["load_balance_loss"][0]) for s in ("encoder", "decoder")]
    assert float(metrics["moe/load_balance_loss"]) == pytest.approx(np.mean(lb), rel=1e-6)
    assert float(loss) == pytest.approx(float(m["cross_ent_loss"] + m["z_loss"] + m["moe/aux_loss"]), rel=1e-6)
