"""The token-by-token decoding loop shared by greedy decoding and sampling.

`tokens_to_logits(tokens [b], cache, step) -> (logits [b, vocab], cache)` runs the model on
the token fed at loop step `step` (BOS at step 0) and returns the next token's logits (with
a key-value cache, or on a buffer when there is none). After a prefill the step-0 logits
can come from the prefill instead (`with_first_logits`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

TokensToLogits = Callable[[jnp.ndarray, Any, jnp.ndarray], tuple[jnp.ndarray, Any]]
# choose(logits [b, vocab], positions [b]) -> tokens [b]; `positions`: each row's output position.
ChooseFn = Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]


def with_first_logits(tokens_to_logits: TokensToLogits, first_logits: jnp.ndarray) -> TokensToLogits:
    """`tokens_to_logits` whose step 0 returns `first_logits` (the prefill's last position)
    without running the model; later steps run it on the fed token."""

    def step_fn(tokens, cache, step):
        return jax.lax.cond(
            step == 0,
            lambda c: (first_logits.astype(jnp.float32), c),
            lambda c: _as_float32(tokens_to_logits(tokens, c, step)),
            cache,
        )

    return step_fn


def _as_float32(result):
    logits, cache = result
    return logits.astype(jnp.float32), cache


def decode_loop(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    max_decode_len: int,
    choose: ChooseFn,
    eos_id: int = 1,
    bos_id: int = 0,
    prompt: jnp.ndarray | None = None,
    prompt_lengths: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Decodes up to `max_decode_len` tokens; returns `(tokens [b, len], log_probs [b])`.

    `choose(logits, positions)` picks the next tokens. `prompt` `[b, len]` (0 = free) forces
    the tokens of its non-zero prefix (token by token). `prompt_lengths` `[b]` says instead
    that the cache already holds each row's prompt of that length (a prefill): row `r` then
    generates at most `max_decode_len - prompt_lengths[r]` tokens, returned from column 0,
    and `choose` sees the output positions `prompt_lengths + step`. After EOS a row emits 0
    (padding). `log_probs` sum the generated (not forced) tokens. Stops early when every
    row has ended.
    """
    if prompt is not None and prompt_lengths is not None:
        raise ValueError("decode_loop takes a forced prompt or prefilled prompt_lengths, not both")
    if prompt is not None:
        prompt = jnp.pad(prompt, ((0, 0), (0, max(0, max_decode_len - prompt.shape[1]))))[:, :max_decode_len]
        prompt_len = jnp.sum(jnp.cumprod(prompt > 0, axis=1), axis=1)
    start = jnp.zeros((batch_size,), jnp.int32) if prompt_lengths is None else prompt_lengths.astype(jnp.int32)
    budget = max_decode_len - start  # tokens each row may still emit

    def cond(state):
        step, _, _, _, done, _ = state
        return (step < max_decode_len) & ~jnp.all(done)

    def body(state):
        step, token, cache, out, done, logp = state
        logits, cache = tokens_to_logits(token, cache, step)
        logits = logits.astype(jnp.float32)
        nxt = choose(logits, start + step).astype(jnp.int32)
        forced = jnp.zeros_like(done)
        if prompt is not None:
            forced = step < prompt_len
            nxt = jnp.where(forced, prompt[:, step], nxt)
        nxt = jnp.where(done, 0, nxt)
        token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), nxt[:, None], axis=-1)[:, 0]
        logp = logp + jnp.where(done | forced, 0.0, token_logp)
        out = out.at[:, step].set(nxt)
        done = done | ((nxt == eos_id) & ~forced) | (step + 1 >= budget)
        return step + 1, nxt, cache, out, done, logp

    state = (
        jnp.array(0, jnp.int32),
        jnp.full((batch_size,), bos_id, jnp.int32),
        cache,
        jnp.zeros((batch_size, max_decode_len), jnp.int32),
        budget <= 0,
        jnp.zeros((batch_size,), jnp.float32),
    )
    _, _, _, out, _, logp = jax.lax.while_loop(cond, body, state)
    return out, logp
