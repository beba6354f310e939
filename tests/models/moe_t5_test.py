"""T5 with routed MLPs (ST-MoE style: every `moe.every`-th MLP of both stacks a mixture of
experts) and the GPT-style decoder with them: parameter layout, the moe/* metrics, training,
greedy decoding with and without the cache, expert-choice routing, scanned layers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.models import DecodeOptions, DecoderOnlyConfig, DecoderOnlyModel, EncoderDecoderModel, get_preset
from cairn.models.model_base import loss_and_metrics
from cairn.models.moe import moe_losses
from cairn.models.moe_config import MoeConfig
from cairn.models.stacking import stack_layers

LAYERS = {"encoder": 4, "decoder": 2}
MOE = MoeConfig(num_experts=4, top_k=2, every=2, capacity_factor=1.0)
# The t5_1_1_tiny preset's architecture (gated GELU, separate logits), narrower; four encoder
# layers (routed: 1 and 3) and two decoder layers (routed: 1), so that the metrics average three
# routed layers of both stacks (the decoder's layers, with cross-attention, cost the most to compile).
CONFIG = get_preset(
    "t5_1_1_tiny",
    vocab_size=67,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=48,
    num_encoder_layers=LAYERS["encoder"],
    num_decoder_layers=LAYERS["decoder"],
    moe=MOE,
)
ROUTED_LAYERS = {"encoder": ["layers_1", "layers_3"], "decoder": ["layers_1"]}
ROUTED = ("router", "wi_0", "wi_1", "wo")


def _batch(seed: int, b: int = 2, li: int = 7, lt: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = rng.integers(2, CONFIG.vocab_size, (b, lt)).astype(np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, CONFIG.vocab_size, (b, li)).astype(np.int32),
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones((b, lt), np.float32),
    }


@pytest.fixture(scope="module")
def model():
    return EncoderDecoderModel(CONFIG)


@pytest.fixture(scope="module")
def params(model, tiny):
    """Random parameters of the init's tree (shapes and dtypes as `model.init` gives them)."""
    return tiny.random_params(model)


def test_every_second_mlp_of_both_stacks_is_routed(model, params):
    axes = model.logical_axes()
    e, d, m = MOE.num_experts, CONFIG.emb_dim, CONFIG.mlp_dim
    for stack in ("encoder", "decoder"):
        for i in range(LAYERS[stack]):
            mlp = params[stack][f"layers_{i}"]["mlp"]
            if i % 2 == 1:
                assert sorted(mlp) == sorted(ROUTED), (stack, i)
                assert mlp["router"]["kernel"].shape == (d, e)
                assert mlp["router"]["kernel"].dtype == jnp.float32
                assert mlp["wi_0"]["kernel"].shape == mlp["wi_1"]["kernel"].shape == (e, d, m)
                assert mlp["wo"]["kernel"].shape == (e, m, d)
                assert axes[stack][f"layers_{i}"]["mlp"]["wo"]["kernel"] == jax.sharding.PartitionSpec(
                    "expert", "mlp", "embed"
                )
            else:  # dense, as t5x names it: the kernels directly under mlp
                assert {k: v.shape for k, v in mlp.items()} == {"wi_0": (d, m), "wi_1": (d, m), "wo": (m, d)}, (
                    stack,
                    i,
                )


def _train(model, params, batch, steps: int, lr: float = 3e-3):
    """`steps` Adam steps on one batch; returns the metrics of each step, and the gradients,
    the plain cross-entropy of the logits and the moe collection of the first (all from one
    compiled step: op by op, each operation would compile its own)."""
    optimizer = optax.adam(lr)
    state = jax.jit(optimizer.init)(params)

    @jax.jit
    def step(params, state):
        (_, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, state = optimizer.update(grads, state, params)
        logits, sown = model.apply_with_aux(params, batch)
        ce = loss_and_metrics(logits, batch, model.label_smoothing, model.z_loss, model.loss_normalizing_factor)[0]
        return optax.apply_updates(params, updates), state, metrics, (grads, ce, sown)

    history, first = [], None
    for _ in range(steps):
        params, state, metrics, out = step(params, state)
        first = out if first is None else first
        history.append(metrics)
    return history, first


@pytest.fixture(scope="module")
def trained(model, params):
    batch = _batch(1)
    history, first = _train(model, params, batch, 6)
    return batch, history, first


def test_loss_fn_averages_the_moe_metrics_over_routed_layers(model, trained):
    _, history, (_, ce, sown) = trained
    metrics = history[0]
    for stack in ("encoder", "decoder"):
        assert sorted(sown[stack]) == ROUTED_LAYERS[stack], sown[stack].keys()
    per_layer = {
        name: [float(sown[s][layer]["mlp"][name][0]) for s, layers in ROUTED_LAYERS.items() for layer in layers]
        for name in ("load_balance_loss", "router_z_loss", "dropped_fraction")
    }
    assert len(set(per_layer["router_z_loss"])) == 3  # three different layers: the mean is a mean
    for name, values in per_layer.items():
        np.testing.assert_allclose(metrics[f"moe/{name}"], np.mean(values), rtol=1e-6)
    # Capacity ceil(n * 2 / 4) for the n = 7 or 6 tokens of a row, two choices each: at random
    # init some assignments overflow their expert.
    assert metrics["moe/dropped_fraction"] > 0
    aux = MOE.load_balance_loss_weight * np.mean(per_layer["load_balance_loss"]) + MOE.router_z_loss_weight * np.mean(
        per_layer["router_z_loss"]
    )
    np.testing.assert_allclose(metrics["moe/aux_loss"], aux, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], ce + aux, rtol=1e-5)


def test_training_steps_reduce_the_loss(trained):
    _, history, (grads, _, _) = trained
    losses = [float(m["loss"]) for m in history]
    assert losses[-1] < losses[0] - 0.1, losses
    for m in history:
        assert all(np.isfinite(float(m[k])) for k in m if k.startswith("moe/"))
    for stack in ("encoder", "decoder"):  # the routers learn (through the routing weights and the aux loss)
        assert float(jnp.abs(grads[stack]["layers_1"]["mlp"]["router"]["kernel"]).max()) > 0


def test_cached_greedy_decoding_equals_the_recomputing_loop_when_dropless(params):
    """Decoding with the cache routes one token per group; the no-cache loop routes whole rows.
    Dropless, no token competes for capacity, so both routings agree token for token."""
    model = EncoderDecoderModel(CONFIG.replace(moe=MOE.replace(dropless=True)))
    batch = {"encoder_input_tokens": _batch(3, b=3)["encoder_input_tokens"]}
    cached, cached_scores = jax.jit(lambda p: model.predict_batch(p, batch, DecodeOptions(max_decode_length=7)))(params)
    plain, plain_scores = jax.jit(
        lambda p: model.predict_batch(p, batch, DecodeOptions(max_decode_length=7, use_cache=False))
    )(params)
    assert cached.shape == (3, 7)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(cached_scores, plain_scores, rtol=1e-5, atol=1e-5)
    assert len(np.unique(np.asarray(cached))) > 2  # not a degenerate all-EOS / all-pad decode


def test_expert_choice_routing_in_the_encoder(params):
    """Expert choice (same parameters as token choice): each expert takes its best tokens of a
    row, no load-balancing loss (balanced by construction), and a row's routing does not
    depend on the other rows."""
    config = CONFIG.replace(moe=MOE.replace(routing="expert_choice"))
    model = EncoderDecoderModel(config)
    apply = jax.jit(model.apply_with_aux)
    batch = _batch(4)
    logits, sown = apply(params, batch)
    metrics = moe_losses(sown, config.moe)
    assert np.isfinite(np.asarray(logits)).all()
    assert float(metrics["moe/load_balance_loss"]) == 0.0 and float(metrics["moe/router_z_loss"]) > 0
    assert 0.0 <= float(metrics["moe/dropped_fraction"]) < 1.0  # 4 experts x 2 slots for 7 tokens
    other = dict(batch, encoder_input_tokens=batch["encoder_input_tokens"].copy())
    other["encoder_input_tokens"][1] = np.random.default_rng(9).integers(2, config.vocab_size, 7)
    changed, _ = apply(params, other)
    np.testing.assert_allclose(changed[0], logits[0], rtol=1e-6, atol=1e-6)
    assert not np.allclose(changed[1], logits[1])


def test_scanned_stacks_route_every_layer(params):
    """`every=1` with scan_layers: the routed kernels get the leading layers axis, the moe
    collection is stacked per layer, and cached decoding runs through the scan."""
    config = CONFIG.replace(scan_layers=True, num_encoder_layers=2, num_decoder_layers=2, moe=MOE.replace(every=1))
    model = EncoderDecoderModel(config)
    # Two routed layers a stack: the every-2 model's routed layers, stacked (saves an init); the
    # decoder's one routed layer twice.
    routed = {s: {"layers_0": params[s]["layers_1"], "layers_1": params[s][ROUTED_LAYERS[s][-1]]} for s in LAYERS}
    params = {
        **params,
        **{
            s: stack_layers({**{k: v for k, v in params[s].items() if not k.startswith("layers_")}, **routed[s]}, 2)
            for s in routed
        },
    }
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    assert params["encoder"]["layers"]["mlp"]["wi_0"]["kernel"].shape == (2, 4, 32, 48)
    assert params["decoder"]["layers"]["mlp"]["router"]["kernel"].shape == (2, 32, 4)
    _, sown = jax.jit(model.apply_with_aux)(params, _batch(5))
    z = sown["encoder"]["layers"]["mlp"]["router_z_loss"][0]
    assert np.shape(z) == (2,) and np.all(np.asarray(z) > 0)
    metrics = moe_losses(sown, config.moe)
    zs = [sown[s]["layers"]["mlp"]["router_z_loss"][0] for s in ("encoder", "decoder")]
    np.testing.assert_allclose(metrics["moe/router_z_loss"], np.mean(np.concatenate(zs)), rtol=1e-6)
    tokens, _ = jax.jit(lambda p: model.predict_batch(p, _batch(5), DecodeOptions(max_decode_length=5)))(params)
    assert tokens.shape == (2, 5)


def test_gpt_style_decoder_with_routed_mlps_trains_a_step(tiny):
    config = DecoderOnlyConfig(
        vocab_size=67, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2, moe=MOE.replace(dropless=True)
    )
    model = DecoderOnlyModel(config)
    params = tiny.random_params(model, seed=7)
    assert "router" in params["layers_1"]["mlp"] and "router" not in params["layers_0"]["mlp"]
    batch = {k: v for k, v in _batch(6).items() if k.startswith("decoder")}
    history, (grads, _, _) = _train(model, params, batch, 2)
    assert float(history[1]["loss"]) < float(history[0]["loss"])
    assert float(history[0]["moe/dropped_fraction"]) == 0.0
    assert float(jnp.abs(grads["layers_1"]["mlp"]["wi_0"]["kernel"]).max()) > 0
