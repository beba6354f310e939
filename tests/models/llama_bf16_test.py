"""Mixed precision on a tiny Llama, 50 AdamW steps from the same initial values:

* bfloat16 compute with float32 parameters (the training policy) follows the float32 run's loss
  within 0.5 % at every step (measured: <= 0.21 %, with the tests' XLA options);
* bfloat16 parameters follow it within 2 % over the first 10 steps (measured 1.1 %) and still
  learn, but lag behind after that: an update smaller than half a bfloat16 step of its weight is
  lost (the RMSNorm scales at 1.0 move in steps of 2**-7), so train with float32 parameters;
* the policy itself: float32 logits and loss, parameters in `param_dtype`, activations in `dtype`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict

from cairn.models import DecoderOnlyModel, LlamaConfig

CONFIG = LlamaConfig(vocab_size=128, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128, num_layers=2)
STEPS = 50


def _batch():
    rng = np.random.default_rng(0)
    # A learnable stream: each row counts up from a random start (mod the vocabulary).
    start = rng.integers(2, 128, (8, 1))
    tokens = (2 + (start + np.arange(32)) % 126).astype(np.int32)
    return {
        "decoder_target_tokens": tokens,
        "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
    }


def _losses(initial, dtype: str, param_dtype: str) -> np.ndarray:
    config = CONFIG.replace(dtype=dtype, param_dtype=param_dtype)
    model = DecoderOnlyModel(config, z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    # The same initial values in every run (bf16 parameters: the float32 ones rounded).
    params = jax.tree_util.tree_map(lambda x: x.astype(param_dtype), initial)
    optimizer = optax.adamw(3e-3, weight_decay=0.0)
    batch = _batch()

    @jax.jit
    def step(params, opt_state):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state, out = optimizer.init(params), []
    for _ in range(STEPS):
        params, opt_state, loss = step(params, opt_state)
        out.append(float(loss))
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(params)} == {param_dtype}
    return np.array(out)


@pytest.fixture(scope="module")
def initial(tiny):
    """The float32 initial values, drawn once for the three runs as the init draws them (every
    kernel and the embedding normal(0, init_std), norm scales 1), with numpy: the init's
    random-number program is not compiled."""
    return tiny.random_params(DecoderOnlyModel(CONFIG), std=CONFIG.init_std)


@pytest.fixture(scope="module")
def float32_losses(initial):
    return _losses(initial, "float32", "float32")


def test_bf16_compute_with_float32_params_follows_float32_within_half_a_percent(initial, float32_losses):
    bf16 = _losses(initial, "bfloat16", "float32")
    assert float32_losses[-1] < 0.2 * float32_losses[0]  # it learns
    rel = np.abs(bf16 - float32_losses) / float32_losses
    assert rel.max() < 0.005, (rel.max(), int(rel.argmax()))


def test_bf16_params_follow_float32_at_first_and_still_learn(initial, float32_losses):
    bf16 = _losses(initial, "bfloat16", "bfloat16")
    rel = np.abs(bf16 - float32_losses) / float32_losses
    assert rel[:10].max() < 0.02, rel[:10]
    assert bf16[-1] < 0.2 * bf16[0]


def test_precision_policy():
    """Abstract evaluation (dtypes only, nothing compiled)."""
    model = DecoderOnlyModel(CONFIG.replace(dtype="bfloat16"))
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(params)} == {"float32"}
    logits, state = jax.eval_shape(
        lambda p: model.module.apply(
            {"params": p}, jnp.ones((1, 8), jnp.int32), capture_intermediates=True, mutable=["intermediates"]
        ),
        params,
    )
    assert logits.dtype == jnp.float32
    outputs = {"/".join(k): v[0] for k, v in flatten_dict(state["intermediates"]).items()}
    assert outputs["layers_0/attention/__call__"].dtype == jnp.bfloat16
    assert outputs["layers_1/mlp/__call__"].dtype == jnp.bfloat16
    assert outputs["layers_1/__call__"].dtype == jnp.bfloat16
    assert outputs["decoder_norm/__call__"].dtype == jnp.bfloat16
    loss, _ = jax.eval_shape(model.loss_fn, params, {k: v[:, :8] for k, v in _batch().items()})
    assert loss.dtype == jnp.float32
