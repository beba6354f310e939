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
    )
