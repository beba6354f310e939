"""Shared fixtures for the models tests: tiny configs and random token helpers (as the `tiny` fixture,
since test modules cannot import conftest under `--import-mode=importlib`)."""

import types

import numpy as np
import pytest

from cairn.models import DecoderOnlyConfig, T5Config

TINY_T5_1_1 = T5Config(
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
TINY_T5_1_0 = TINY_T5_1_1.replace(mlp_activations=("relu",), logits_via_embedding=True, num_decoder_layers=3)
TINY_DECODER_ONLY = DecoderOnlyConfig(vocab_size=67, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2)


def random_tokens(seed: int, shape, vocab: int, low: int = 2) -> np.ndarray:
    """Tokens in `[low, vocab)` (0 = padding and 1 = EOS are avoided by default)."""
    return np.random.default_rng(seed).integers(low, vocab, size=shape).astype(np.int32)


@pytest.fixture(scope="session")
def tiny():
    return types.SimpleNamespace(
        t5_1_1=TINY_T5_1_1, t5_1_0=TINY_T5_1_0, decoder_only=TINY_DECODER_ONLY, random_tokens=random_tokens
    )
