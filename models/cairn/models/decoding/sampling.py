"""Temperature sampling with top-k and top-p (nucleus) filtering, from a stateless key.

Row `r`'s token at output position `s` is drawn with the key `fold_in(fold_in(rng, row_ids[r]), s)`.
`row_ids` default to the row indices; `predict_batch` passes an id of each row's own content
(`prompts.row_ids`: a hash of its prompt and its decode index), so that a row's sample is the
same alone and in any batch, at any position and padding width. The same `rng` gives the same
tokens, rows repeated for several decodes differ, and a prompt prefilled or forced token by
token meets the same keys.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cairn.models.decoding.loop import TokensToLogits, decode_loop

NEG_INF = -1e10


def filter_logits(logits, top_k: int = 0, top_p: float = 1.0):
    """Sets to -inf the logits outside the top `top_k` and outside the smallest set whose
    probability reaches `top_p` (the most likely token always stays)."""
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, NEG_INF, logits)
    if top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each token
        sorted_logits = jnp.where(before >= top_p, NEG_INF, sorted_logits)
        inverse = jnp.argsort(order, axis=-1)
        logits = jnp.take_along_axis(sorted_logits, inverse, axis=-1)
    return logits


def sample_decode(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    batch_size: int,
    max_decode_len: int,
    rng: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int = 1,
    prompt: jnp.ndarray | None = None,
    prompt_lengths: jnp.ndarray | None = None,
    max_new: int = 0,
    row_ids: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`(tokens, log_probs)` sampled from `softmax(filtered logits / temperature)`.

    `temperature=0` is greedy decoding. `log_probs` are under the unfiltered model.
    `prompt`, `prompt_lengths`, `max_new`: as in `decode_loop`; `row_ids` `[b]` (uint32 or
    int32): what each row's key is folded with (module docstring; default the row index).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")

    ids = jnp.arange(batch_size, dtype=jnp.uint32) if row_ids is None else jnp.asarray(row_ids).astype(jnp.uint32)
    row_keys = jax.vmap(lambda r: jax.random.fold_in(rng, r))(ids)

    def draw(key, position, row_logits):
        return jax.random.categorical(jax.random.fold_in(key, position), row_logits)

    def choose(logits, positions):
        if temperature == 0.0:
            return jnp.argmax(logits, axis=-1)
        scaled = filter_logits(logits / temperature, top_k, top_p)
        return jax.vmap(draw)(row_keys, positions, scaled)

    return decode_loop(
        tokens_to_logits,
        cache,
        batch_size,
        max_decode_len,
        choose,
        eos_id=eos_id,
        prompt=prompt,
        prompt_lengths=prompt_lengths,
        max_new=max_new,
    )
