"""Shared fixtures for the models tests: tiny configs and random token helpers (as the `tiny` fixture,
since test modules cannot import conftest under `--import-mode=importlib`)."""

import types

import numpy as np
import pytest


def random_tokens(seed: int, shape, vocab: int, low: int = 2) -> np.ndarray:
    """Tokens in `[low, vocab)` (0 = padding and 1 = EOS are avoided by default)."""
    return np.random.default_rng(seed).integers(low, vocab, size=shape).astype(np.int32)


def random_params(model, seed: int = 0, std: float = 0.2):
    """Parameters of `model`'s tree (shapes and dtypes from its init, evaluated abstractly) drawn
    with numpy: norm scales 1, everything else normal(0, std). For tests whose property holds for
    any parameters: nothing is compiled (a jitted init's random number generation costs seconds
    of XLA compilation per model)."""
    import jax

    return random_like(jax.eval_shape(model.init, jax.random.PRNGKey(seed)), seed, std)


def random_like(shapes, seed: int = 0, std: float = 0.2):
    """`random_params` for a tree of shapes (e.g. `jax.eval_shape` of a network's `init`)."""
    import jax

    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        if "scale" in jax.tree_util.keystr(path):
            return np.ones(leaf.shape, leaf.dtype)
        return (rng.standard_normal(leaf.shape) * std).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def projection(model, params, inputs, real):
    """A fixed random projection (seed 7) of `model`'s logits on `inputs`, zero off the `real`
    positions `[b, l]`: the loss of `projected_run`."""
    import jax
    import jax.numpy as jnp

    shape = jax.eval_shape(lambda p: model.module.apply({"params": p}, *inputs), params).shape
    return jnp.asarray(np.random.default_rng(7).standard_normal(shape), jnp.float32) * real[:, :, None]


def projected_run(model, params, inputs, proj):
    """`((loss, logits), grads)` of `model`'s network on `inputs` with the loss
    `sum(logits * proj)` (`projection`): two networks that compute the same function give the
    same loss and gradients."""
    import jax
    import jax.numpy as jnp

    def fn(p):
        logits = model.module.apply({"params": p}, *inputs)
        return jnp.sum(logits * proj), logits

    return jax.jit(jax.value_and_grad(fn, has_aux=True))(params)


def assert_runs_agree(got, want, real):
    """Two `projected_run` results: equal logits at real positions, losses, and gradients
    (float32 sums in another order: compared by norm, every reference gradient non-zero)."""
    import jax

    (loss_g, logits_g), grads_g = got
    (loss_w, logits_w), grads_w = want
    sel = np.asarray(real, bool)
    np.testing.assert_allclose(np.asarray(logits_g)[sel], np.asarray(logits_w)[sel], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(loss_g), float(loss_w), rtol=1e-5)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads_g), jax.tree_util.tree_leaves(grads_w)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.linalg.norm(w) > 0, jax.tree_util.keystr(path)
        assert np.linalg.norm(g - w) <= 1e-4 * np.linalg.norm(w), jax.tree_util.keystr(path)


def _tiny_configs():
    """The tiny T5.1.1, T5.1.0 and decoder-only configs (imported here, not at the top: a test of
    one module, e.g. //tests/models:argmax_test, depends on that module's target only)."""
    from cairn.models import DecoderOnlyConfig, T5Config

    t5_1_1 = T5Config(
        vocab_size=67,
        emb_dim=32,
        num_heads=4,
        head_dim=8,
        mlp_dim=48,
        num_encoder_layers=2,
        num_decoder_layers=2,
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=False,
    )
    t5_1_0 = t5_1_1.replace(mlp_activations=("relu",), logits_via_embedding=True, num_decoder_layers=3)
    decoder_only = DecoderOnlyConfig(vocab_size=67, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2)
    return t5_1_1, t5_1_0, decoder_only


@pytest.fixture(scope="session")
def tiny():
    t5_1_1, t5_1_0, decoder_only = _tiny_configs()
    return types.SimpleNamespace(
        t5_1_1=t5_1_1,
        t5_1_0=t5_1_0,
        decoder_only=decoder_only,
        random_tokens=random_tokens,
        random_params=random_params,
        random_like=random_like,
        projection=projection,
        projected_run=projected_run,
        assert_runs_agree=assert_runs_agree,
    )
