"""Logits of a transformers model and of Cairn's decoder on the same tokens (the Llama and
Mixtral interchange tests)."""

import functools

import jax
import numpy as np
import torch

from cairn.models import DecoderOnlyModel, LlamaConfig


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """float32 logits of a transformers causal LM (no gradient)."""
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@functools.lru_cache
def _apply(config: LlamaConfig):
    return jax.jit(DecoderOnlyModel(config).apply)


def our_logits(config: LlamaConfig, params, tokens: np.ndarray) -> np.ndarray:
    """Cairn's logits for `tokens` (one jitted apply per config)."""
    return np.asarray(_apply(config)(params, {"decoder_input_tokens": tokens}))
