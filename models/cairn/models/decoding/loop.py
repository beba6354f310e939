"""The token-by-token decoding loop shared by greedy decoding and sampling.

`tokens_to_logits(tokens [b], cache, step) -> (logits [b, vocab], cache)` runs the model on
the token at position `step` (with a key-value cache, or on a buffer when there is none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

TokensToLogits = Callable[[jnp.ndarray, Any, jnp.ndarray], tuple[jnp.ndarray, Any]]
ChooseFn = Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]


def decode_loop(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    max_decode_len: int,
    choose: ChooseFn,
    eos_id: int = 1,
    bos_id: int = 0,
    prompt: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Decodes up to `max_decode_len` tokens; returns `(tokens [b, len], log_probs [b])`.

    `choose(logits, step)` picks the next tokens. `prompt` `[b, len]` (0 = free) forces
    the tokens of its non-zero prefix. After EOS a row emits 0 (padding). Stops early when
    every row has ended.
    """
    if prompt is not None:
        prompt = jnp.pad(prompt, ((0, 0), (0, max(0, max_decode_len - prompt.shape[1]))))[:, :max_decode_len]
        prompt_len = jnp.sum(jnp.cumprod(prompt > 0, axis=1), axis=1)

    def cond(state):
        step, _, _, _, done, _ = state
        return (step < max_decode_len) & ~jnp.all(done)

    def body(state):
        step, token, cache, out, done, logp = state
        logits, cache = tokens_to_logits(token, cache, step)
        logits = logits.astype(jnp.float32)
        nxt = choose(logits, step).astype(jnp.int32)
        forced = jnp.zeros_like(done)
        if prompt is not None:
            forced = step < prompt_len
            nxt = jnp.where(forced, prompt[:, step], nxt)
        nxt = jnp.where(done, 0, nxt)
        token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), nxt[:, None], axis=-1)[:, 0]
        logp = logp + jnp.where(done | forced, 0.0, token_logp)
        out = out.at[:, step].set(nxt)
        done = done | ((nxt == eos_id) & ~forced)
        return step + 1, nxt, cache, out, done, logp

    state = (
        jnp.array(0, jnp.int32),
        jnp.full((batch_size,), bos_id, jnp.int32),
        cache,
        jnp.zeros((batch_size, max_decode_len), jnp.int32),
        jnp.zeros((batch_size,), bool),
        jnp.zeros((batch_size,), jnp.float32),
    )
    _, _, _, out, _, logp = jax.lax.while_loop(cond, body, state)
    return out, logp
