"""A Mixtral-style Llama (`mixtral_tiny`): the parameter tree, scanned and unrolled layers agree,
a few Adam steps lower the loss (token and expert choice), and cached greedy decoding equals
a loop of full forward passes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict

from cairn.models import DecodeOptions, DecoderOnlyModel, get_preset
from cairn.models.stacking import stack_layers

TINY = get_preset("mixtral_tiny")


def _batch(seed=0, shape=(2, 10), vocab=256):
    targets = np.random.default_rng(seed).integers(2, vocab, size=shape).astype(np.int32)
    inputs = np.concatenate([np.zeros((shape[0], 1), np.int32), targets[:, :-1]], axis=1)
    return {"decoder_input_tokens": inputs, "decoder_target_tokens": targets}


_HELPERS = {}


@pytest.fixture(scope="module", autouse=True)
def _helpers(tiny):
    """conftest's helpers for `_params` (test modules cannot import conftest)."""
    _HELPERS["random_params"] = tiny.random_params


@functools.cache
def _params():
    """Random parameters of the init's tree (shapes and dtypes of `init`; normal(0, init_std))."""
    return _HELPERS["random_params"](DecoderOnlyModel(TINY), std=TINY.init_std)


def test_parameter_tree_and_logical_axes():
    shapes = {"/".join(k): v.shape for k, v in flatten_dict(_params()).items()}
    mlp = {k.split("/mlp/")[1]: v for k, v in shapes.items() if k.startswith("layers_0/mlp/")}
    assert mlp == {
        "router/kernel": (64, 4),
        "wi_0/kernel": (4, 64, 128),
        "wi_1/kernel": (4, 64, 128),
        "wo/kernel": (4, 128, 64),
    }
    assert shapes["logits/kernel"] == (64, 256)  # untied
    assert _params()["layers_0"]["mlp"]["router"]["kernel"].dtype == jnp.float32
    axes = DecoderOnlyModel(TINY.replace(scan_layers=True)).logical_axes()["layers"]["mlp"]
    assert tuple(axes["wi_0"]["kernel"]) == ("layers", "expert", "embed", "mlp")
    assert tuple(axes["wo"]["kernel"]) == ("layers", "expert", "mlp", "embed")
    assert tuple(axes["router"]["kernel"]) == ("layers", "embed", None)


def test_scanned_and_unrolled_layers_agree():
    params, batch = _params(), _batch()
    scanned = stack_layers(params, TINY.num_layers)
    assert scanned["layers"]["mlp"]["wi_0"]["kernel"].shape == (2, 4, 64, 128)
    plain_model, scan_model = DecoderOnlyModel(TINY), DecoderOnlyModel(TINY.replace(scan_layers=True))
    # One compiled program per layout: the loss with its metrics, the logits and the sown collections.
    both = lambda m: jax.jit(lambda p, b: (m.loss_fn(p, b), m.apply_with_aux(p, b)))
    plain, (plain_logits, _) = both(plain_model)(params, batch)
    scan, (scan_logits, sown) = both(scan_model)(scanned, batch)
    np.testing.assert_allclose(plain_logits, scan_logits, rtol=1e-5, atol=1e-5)
    for key in ("loss", "moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/aux_loss"):
        np.testing.assert_allclose(plain[1][key], scan[1][key], rtol=1e-5, err_msg=key)
    # The scanned `moe` collection is stacked over the layers.
    assert sown["layers"]["mlp"]["router_z_loss"][0].shape == (2,)


@pytest.mark.parametrize("routing", ["token_choice", "expert_choice"])
def test_adam_steps_lower_the_loss(routing):
    config = TINY.replace(moe=TINY.moe.replace(routing=routing), scan_layers=True)
    model = DecoderOnlyModel(config)
    params = stack_layers(_params(), TINY.num_layers)  # the routing choice leaves the parameters as they are
    batch = _batch(seed=2)
    optimizer = optax.adam(3e-3)

    @jax.jit
    def step(params, state):
        (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, metrics

    state = jax.jit(optimizer.init)(params)  # compiled (op by op, each operation compiles its own)
    router_before = np.asarray(params["layers"]["mlp"]["router"]["kernel"])
    losses = []
    for _ in range(6):
        params, state, loss, metrics = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1, losses
    assert np.abs(np.asarray(params["layers"]["mlp"]["router"]["kernel"]) - router_before).max() > 0
    if routing == "expert_choice":
        assert float(metrics["moe/load_balance_loss"]) == 0.0  # balanced by construction
    else:
        assert float(metrics["moe/load_balance_loss"]) > 1.0


def test_cached_greedy_decoding_equals_full_forward_passes():
    # Dropless, so the routing of a token does not depend on the other tokens of its group
    # (the prefill, each decoding step, and the full passes route different groups).
    config = TINY.replace(moe=TINY.moe.replace(dropless=True))
    model = DecoderOnlyModel(config)
    # Kernels and embedding of std 0.2 (10x the init's), so that the continuation is not degenerate.
    params = _HELPERS["random_params"](model, seed=3, std=0.2)
    prompts = np.array([[5, 17, 42], [9, 8, 7]], np.int32)
    steps = 6
    options = DecodeOptions(max_decode_length=3 + steps, eos_id=1)
    out, _ = jax.jit(functools.partial(model.predict_batch, options=options))(params, prompts)
    out = np.asarray(out)

    # The reference: BOS (0) and the prompt, then one full forward pass per token over a buffer
    # of the final length (causal, and dropless: the columns not yet written change nothing
    # before them), the argmax at the last written position appended.
    apply = jax.jit(lambda p, tokens: model.apply(p, {"decoder_input_tokens": tokens}))
    seq = np.zeros((2, 4 + steps), np.int32)
    seq[:, 1:4] = prompts
    for pos in range(3, 3 + steps):
        seq[:, pos + 1] = np.asarray(apply(params, seq))[:, pos].argmax(-1)
    expected = np.concatenate([prompts, seq[:, 4:]], axis=1)
    # After an EOS the decoder writes 0s.
    for row in expected:
        eos = np.flatnonzero(row[3:] == 1)
        if eos.size:
            row[3 + eos[0] + 1 :] = 0
    np.testing.assert_array_equal(out, expected)
    assert len(set(out[:, 3:].ravel().tolist())) > 1  # not a degenerate continuation
