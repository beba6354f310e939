"""Sparse upcycling (`cairn.models.upcycle`): MoE parameters from a dense model's.

The property checked at step 0: with each token's top-k routing weights renormalised to sum to
1 and no token dropped (dropless, or a capacity of the whole group), every routed MLP returns
`sum_k w_k * mlp(x) = mlp(x)`, so the upcycled model's logits equal the dense model's (float32,
within 2e-5). With drops, a token dropped by all its experts gets a zero MLP output (it skips the
MLP through the residual), so its logits differ.
"""

import functools

import flax.linen as nn
import flax.traverse_util as traverse_util
import jax
import numpy as np
import pytest

from cairn.models import DecoderOnlyModel, EncoderDecoderModel, LlamaConfig, MoeConfig, UpcycleError, upcycle
from cairn.models.stacking import stack_layers

LLAMA = LlamaConfig(vocab_size=67, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=2)
ROUTER_RNG = jax.random.PRNGKey(11)


def _tokens(seed: int, shape=(2, 8), vocab: int = 67) -> np.ndarray:
    return np.random.default_rng(seed).integers(2, vocab, shape).astype(np.int32)


def _batch(t5: bool) -> dict[str, np.ndarray]:
    dec = _tokens(1)
    batch = {"decoder_input_tokens": dec, "decoder_target_tokens": dec}
    return {**batch, "encoder_input_tokens": _tokens(2, (2, 9))} if t5 else batch


@pytest.fixture(scope="module")
def dense_llama(tiny):
    """Any dense parameters do (random, of the init's tree: nothing compiled)."""
    return tiny.random_params(DecoderOnlyModel(LLAMA), seed=0)


@pytest.fixture(scope="module")
def dense_t5(tiny):
    return tiny.random_params(EncoderDecoderModel(tiny.t5_1_1), seed=1)


def _cases(name, dense_llama, dense_t5, tiny):
    """(dense config, dense params, MoE config, model class)."""
    if name == "llama":  # every 2nd layer routed, dropless
        return LLAMA, dense_llama, MoeConfig(num_experts=4, top_k=2, every=2, dropless=True), DecoderOnlyModel
    if name == "llama_scanned":  # scanned: every layer routed, kernels [layers, experts, ...]
        dense = stack_layers(dense_llama, 2)
        moe = MoeConfig(num_experts=4, top_k=2, dropless=True)
        return LLAMA.replace(scan_layers=True), dense, moe, DecoderOnlyModel
    # T5, both stacks' layer 1 routed; capacity_factor = experts / top_k: every expert can take
    # the whole row, so nothing drops without dropless.
    moe = MoeConfig(num_experts=4, top_k=2, every=2, capacity_factor=2.0)
    return tiny.t5_1_1, dense_t5, moe, EncoderDecoderModel


def _is_mlp(module, method):
    return isinstance(module, nn.Module) and module.name == "mlp"


@functools.lru_cache
def _jitted_capture(model):
    def call(p, tokens):
        return model.module.apply({"params": p}, tokens, capture_intermediates=_is_mlp, mutable=["intermediates"])

    return jax.jit(call)


def _run_capturing_the_mlp(model, params):
    """Logits on `_batch(False)` and layer 0's MLP output (one compiled program per model)."""
    logits, state = _jitted_capture(model)(params, _batch(False)["decoder_input_tokens"])
    return logits, np.asarray(state["intermediates"]["layers_0"]["mlp"]["__call__"][0])


@pytest.mark.parametrize("name", ["llama", "llama_scanned", "t5"])
def test_upcycled_model_computes_the_dense_function_at_step_0(name, dense_llama, dense_t5, tiny):
    dense_config, dense, moe, model_cls = _cases(name, dense_llama, dense_t5, tiny)
    params = upcycle(dense, dense_config, moe, ROUTER_RNG)
    moe_model = model_cls(dense_config.replace(moe=moe))
    # The MoE model's own init: its shapes abstractly, its router values computed (only those:
    # the rest of the init program is dead code, so compiling it is cheap).
    fresh_shapes = jax.eval_shape(moe_model.init, ROUTER_RNG)
    assert jax.tree.map(np.shape, fresh_shapes) == jax.tree.map(np.shape, params)
    flat, flat_dense = traverse_util.flatten_dict(params), traverse_util.flatten_dict(dense)
    routers = [p for p in flat if p[-2] == "router"]
    assert routers, "no routed layer"
    fresh = jax.jit(lambda key: {p: traverse_util.flatten_dict(moe_model.init(key))[p] for p in routers})(ROUTER_RNG)
    scanned = dense_config.scan_layers
    for path, value in flat.items():
        if path[-2] == "router":  # fresh, as the MoE model's own init draws it
            np.testing.assert_array_equal(value, fresh[path])
        elif path[:-2] + ("router", "kernel") in flat:  # each expert a copy of the dense kernel
            source = flat_dense.get(path, flat_dense.get(path[:-1]))  # Llama `wi_0/kernel`, T5 `wi_0`
            experts = np.moveaxis(np.asarray(value), 1 if scanned else 0, 0)
            assert experts.shape[0] == moe.num_experts
            for expert in experts:
                np.testing.assert_array_equal(expert, source)
        else:
            np.testing.assert_array_equal(value, flat_dense[path])

    batch = _batch(model_cls is EncoderDecoderModel)
    if name == "llama":  # the dense pass the next test runs too (one compiled program for both)
        dense_logits = _run_capturing_the_mlp(DecoderOnlyModel(LLAMA), dense)[0]
    else:
        dense_logits = jax.jit(model_cls(dense_config).apply)(dense, batch)
    logits, sown = jax.jit(moe_model.apply_with_aux)(params, batch)
    dropped = [np.asarray(v) for p, v in traverse_util.flatten_dict(sown).items() if p[-1] == "dropped_fraction"]
    assert len(dropped) == (2 if name == "t5" else 1) and all(np.all(d == 0) for d in dropped)
    np.testing.assert_allclose(logits, dense_logits, rtol=0, atol=2e-5)
    assert float(np.max(np.abs(dense_logits))) > 1e-2  # logits of some size, not all ~0


def test_dropped_tokens_get_a_zero_mlp_output(dense_llama):
    """Top-1 (weight 1) with one slot per expert: a kept token's routed MLP output is the dense
    MLP's, a dropped token's is zero, and the logits differ from the dense model's."""
    moe = MoeConfig(num_experts=4, top_k=1, capacity_factor=0.5)  # ceil(0.5 * 8 / 4) = 1 slot each
    params = upcycle(dense_llama, LLAMA, moe, ROUTER_RNG)
    dense_logits, dense_out = _run_capturing_the_mlp(DecoderOnlyModel(LLAMA), dense_llama)
    logits, out = _run_capturing_the_mlp(DecoderOnlyModel(LLAMA.replace(moe=moe)), params)
    zero = np.all(out == 0, axis=-1)
    kept = ~zero
    np.testing.assert_allclose(out[kept], dense_out[kept], rtol=0, atol=1e-6)
    # At most one token per expert is kept: 4 of each row's 8 tokens at most.
    assert kept.sum(axis=1).max() <= moe.num_experts and zero.sum() >= 8
    assert np.abs(dense_out[zero]).max() > 0
    assert not np.allclose(logits, dense_logits, atol=1e-3)


def test_errors_name_the_tensor(dense_llama, dense_t5, tiny):
    moe = MoeConfig(num_experts=4, every=2)
    wider = r"^layers_1/mlp/wi_0/kernel: the dense kernel has shape \(32, 48\).*needs \(32, 64\)"
    with pytest.raises(UpcycleError, match=wider):
        upcycle(dense_llama, LLAMA, moe.replace(expert_mlp_dim=64), ROUTER_RNG)
    with pytest.raises(UpcycleError, match=r"^decoder/layers_1/mlp/wi_0: the dense kernel has shape \(32, 48\)"):
        upcycle(dense_t5, tiny.t5_1_1, moe.replace(expert_mlp_dim=40), ROUTER_RNG)
    narrower = r"^decoder_norm/scale: the dense param has shape \(32,\), the MoE model needs \(16,\)"
    with pytest.raises(UpcycleError, match=narrower):
        upcycle(dense_llama, LLAMA, LLAMA.replace(emb_dim=16, moe=moe), ROUTER_RNG)
    missing = {k: v for k, v in dense_llama.items() if k != "decoder_norm"}
    with pytest.raises(UpcycleError, match=r"^decoder_norm/scale: missing from the dense params"):
        upcycle(missing, LLAMA, moe, ROUTER_RNG)
    no_mlp = {**dense_llama, "layers_1": {k: v for k, v in dense_llama["layers_1"].items() if k != "mlp"}}
    with pytest.raises(UpcycleError, match=r"^layers_1/mlp/wi_0: missing from the dense params"):
        upcycle(no_mlp, LLAMA, moe, ROUTER_RNG)
    extra = {**dense_llama, "logits": {"kernel": np.zeros((32, 67), np.float32)}}
    with pytest.raises(UpcycleError, match=r"^logits/kernel: a dense param the MoE model has no place for"):
        upcycle(extra, LLAMA, moe, ROUTER_RNG)
    with pytest.raises(UpcycleError, match="has moe set"):
        upcycle(dense_llama, LLAMA.replace(moe=moe), moe, ROUTER_RNG)
    with pytest.raises(UpcycleError, match="the MoE config is a T5Config"):
        upcycle(dense_llama, LLAMA, tiny.t5_1_1.replace(moe=moe), ROUTER_RNG)
    assert issubclass(UpcycleError, ValueError)
