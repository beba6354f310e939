"""Greedy decoding: the most likely token at every step."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from cairn.models.decoding.loop import TokensToLogits, decode_loop


def greedy_decode(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    max_decode_len: int,
    eos_id: int = 1,
    prompt: jnp.ndarray | None = None,
    prompt_lengths: jnp.ndarray | None = None,
    max_new: int = 0,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`(tokens [b, max_decode_len], log_probs [b])` by argmax at every step (`prompt`,
    `prompt_lengths`, `max_new`: as in `decode_loop`)."""
    return decode_loop(
        tokens_to_logits,
        cache,
        batch_size,
        max_decode_len,
        lambda logits, step: jnp.argmax(logits, axis=-1),
        eos_id=eos_id,
        prompt=prompt,
        prompt_lengths=prompt_lengths,
        max_new=max_new,
    )
