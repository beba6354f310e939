"""Prompts for a prefill: right-padded prompts left-aligned behind the model's start token
(`prompt_start_id`; none when it is None), and outputs reassembled.

A prompt row is its non-zero prefix (0 = padding; an all-zero row is an empty prompt).
The prefill buffer puts the start token and the prompt at its right end, so every row's last prompt
token sits in the last column and the continuation goes on from the same cache position
for all rows; the padding in front is masked by segment id 0.
"""

from __future__ import annotations

import jax.numpy as jnp


def prompt_lengths(prompts: jnp.ndarray) -> jnp.ndarray:
    """`[b]`: the length of each row's non-zero prefix."""
    return jnp.sum(jnp.cumprod(prompts > 0, axis=1), axis=1).astype(jnp.int32)


_GOLDEN = 0x9E3779B1  # 2**32 / golden ratio: position weights of `content_ids`


def content_ids(tokens: jnp.ndarray, copies: int = 1) -> jnp.ndarray:
    """`[b * copies]` uint32: an id of each row's tokens, the same at any padding width and batch
    position (what sampling folds each row's key with: `sample_decode(row_ids=...)`), each row's
    `copies` (its several decodes) numbered 0..copies-1 into it.

    The id is a murmur3-finalized sum of `token_i * (i + 1) * 0x9E3779B1` (mod 2**32): padding
    (token 0) adds nothing, so a row padded wider has the same id. Two rows with the same tokens
    share it (and so their samples)."""
    t = tokens.astype(jnp.uint32)
    weights = (jnp.arange(1, t.shape[1] + 1, dtype=jnp.uint32) * jnp.uint32(_GOLDEN))[None, :]
    h = jnp.sum(t * weights, axis=1, dtype=jnp.uint32)
    h = jnp.repeat(h, copies) + jnp.tile(jnp.arange(copies, dtype=jnp.uint32), t.shape[0]) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def left_align(prompts: jnp.ndarray, bos_id: int | None = 0) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """`(tokens [b, w], segment_ids [b, w], lengths [b])` for prompts `[b, p]`.

    Row `r` of `tokens` is `[0, ..., 0, BOS, prompt[r, :lengths[r]]]` (`w = p + 1`); `segment_ids`
    is 1 on BOS and the prompt, 0 on the padding before them. `bos_id=None` puts nothing in
    front (`w = p`: the prompt holds its own start token; an empty prompt then has nothing to
    continue from).
    """
    b, p = prompts.shape
    lengths = prompt_lengths(prompts)
    source = prompts.astype(jnp.int32)
    if bos_id is not None:
        source = jnp.concatenate([jnp.full((b, 1), bos_id, jnp.int32), source], axis=1)
    width = source.shape[1]
    shift = width - lengths - (bos_id is not None)  # padding columns in front of BOS and the prompt
    index = jnp.arange(width)[None, :] - shift[:, None]
    valid = index >= 0
    tokens = jnp.take_along_axis(source, jnp.maximum(index, 0), axis=1)
    return jnp.where(valid, tokens, 0), valid.astype(jnp.int32), lengths


def prepend_prompts(prompts: jnp.ndarray, lengths: jnp.ndarray, continuations: jnp.ndarray) -> jnp.ndarray:
    """`[b, L]` (`L` = `continuations.shape[1]`): each row's prompt (`lengths[r]` tokens of
    `prompts`) followed by its continuation, cut at `L`."""
    b, length = continuations.shape
    cols = jnp.arange(length)[None, :]
    prompt_part = jnp.pad(prompts, ((0, 0), (0, max(0, length - prompts.shape[1]))))[:, :length]
    from_cont = jnp.take_along_axis(continuations, jnp.maximum(cols - lengths[:, None], 0), axis=1)
    return jnp.where(cols < lengths[:, None], prompt_part, from_cont).astype(jnp.int32)
