"""Prompt tuning (Lester et al. 2021): a learned prompt of `length` embeddings in front of the
encoder input (T5) or the decoder input (GPT-style and Llama decoders), trained alone with the
model frozen.

The prompt is a parameter `token_embedder/prompt` `[length, embed]` beside the embedding table.
A params tree that holds it is a *prompted* tree: every model wrapper (`EncoderDecoderModel`,
`DecoderOnlyModel`) puts the virtual token ids `vocab_size, ..., vocab_size + length - 1`
(`virtual_ids`; past the table, so they never collide with a real token) in front of each row
(`prompt_batch`: the encoder input, or the decoder input with target and loss weight 0 there,
so no loss is computed on the prompt), and `layers.Embed` looks those ids up in the prompt
instead of the table. Since the prompt positions are ordinary non-padding positions, the
masks, relative position biases, RoPE positions, decode caches and left-aligned decoder
prompts (`prepend_to_aligned`) need no change: every later position sees the whole prompt.
Packed batches (segment ids) are refused: one prompt per row cannot precede each segment.

`PromptTuningModel(model, config)` is what the trainer trains: its params are
`{"token_embedder": {"prompt": ...}}`, the base params are the trainer's frozen tree
(`frozen_model`), and `merged(prompt, base)` is the prompted tree (evaluation, decoding).
`initial_params(rng, base)` draws the configured initialisation, which reads the base's
embedding table (`init_prompt`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models import layers

EMBEDDER = "token_embedder"  # the embedding module of every family (its table: `embedding`)
PROMPT = layers.PROMPT  # the prompt's name beside the table
INITS = ("vocab_sample", "tokens", "random_uniform")
FIRST_SAMPLED_ID = 3  # below it: padding, EOS, UNK in the T5 vocabularies (never sampled)


@dataclasses.dataclass(frozen=True)
class PromptTuningConfig:
    """`length` (>= 1) prompt embeddings, initialised by `init`:

    - `vocab_sample`: the embeddings of `length` token ids drawn (seeded, without replacement
      when there are enough) from `[FIRST_SAMPLED_ID, sample_top)`: in SentencePiece
      vocabularies ids are ordered by frequency, so these are frequent tokens (Lester et al.'s
      "sampled vocab", the prompt-tuning repository's `from_sample_of_embeddings`);
    - `tokens`: the embeddings of `tokens` (e.g. a tokenized task description, or class
      labels), the rows past them sampled as `vocab_sample`;
    - `random_uniform`: uniform in `[-uniform_scale, uniform_scale]`.
    """

    length: int = 20
    init: str = "vocab_sample"
    tokens: tuple[int, ...] = ()
    sample_top: int = 5000
    uniform_scale: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"PromptTuningConfig.length must be an int >= 1, got {self.length!r}")
        if self.init not in INITS:
            raise ValueError(f"PromptTuningConfig.init must be one of {INITS}, got {self.init!r}")
        if self.init == "tokens" and not self.tokens:
            raise ValueError("PromptTuningConfig.tokens must hold token ids for init='tokens'")
        if self.init != "tokens" and self.tokens:
            raise ValueError(f"PromptTuningConfig.tokens are used by init='tokens' only (init is {self.init!r})")
        if len(self.tokens) > self.length:
            raise ValueError(
                f"PromptTuningConfig.tokens: {len(self.tokens)} token ids do not fit a prompt of length {self.length}"
            )
        if any(t < 0 for t in self.tokens):
            raise ValueError(f"PromptTuningConfig.tokens must be token ids >= 0, got {self.tokens}")
        if self.sample_top <= FIRST_SAMPLED_ID:
            raise ValueError(f"PromptTuningConfig.sample_top must be > {FIRST_SAMPLED_ID}, got {self.sample_top}")
        if not self.uniform_scale > 0:
            raise ValueError(f"PromptTuningConfig.uniform_scale must be > 0, got {self.uniform_scale}")


def sampled_ids(rng: jax.Array, vocab_size: int, config: PromptTuningConfig) -> jnp.ndarray:
    """`[length]` token ids drawn from `[FIRST_SAMPLED_ID, min(sample_top, vocab_size))` (without
    replacement when the range holds `length` ids), deterministic given `rng`."""
    top = min(config.sample_top, vocab_size)
    if top <= FIRST_SAMPLED_ID:
        raise ValueError(f"a vocabulary of {vocab_size} ids has none to sample from (ids >= {FIRST_SAMPLED_ID})")
    pool = jnp.arange(FIRST_SAMPLED_ID, top, dtype=jnp.int32)
    return jax.random.choice(rng, pool, (config.length,), replace=config.length > pool.shape[0])


def init_prompt(rng: jax.Array, table: jnp.ndarray, config: PromptTuningConfig) -> jnp.ndarray:
    """The initial prompt `[length, embed]` (in the table's dtype) of `config.init`, from the
    embedding table `[vocab, embed]` (`PromptTuningConfig`'s docstring)."""
    vocab, emb = table.shape
    if config.init == "random_uniform":
        scale = config.uniform_scale
        return jax.random.uniform(rng, (config.length, emb), jnp.float32, -scale, scale).astype(table.dtype)
    ids = sampled_ids(rng, vocab, config)
    if config.init == "tokens":
        if max(config.tokens) >= vocab:
            raise ValueError(f"PromptTuningConfig.tokens: id {max(config.tokens)} is past the vocabulary ({vocab})")
        ids = ids.at[: len(config.tokens)].set(jnp.asarray(config.tokens, jnp.int32))
    return jnp.take(table, ids, axis=0)


def prompt_of(params: Any) -> Any:
    """The prompt `[length, embed]` of a prompted params tree, or None."""
    embedder = params.get(EMBEDDER) if isinstance(params, Mapping) else None
    if not isinstance(embedder, Mapping):
        return None
    return embedder.get(PROMPT)


def prompt_length(params: Any) -> int:
    """The number of prompt embeddings in `params` (0: not prompted)."""
    prompt = prompt_of(params)
    return 0 if prompt is None else int(prompt.shape[0])


def with_prompt(base: Any, prompt: Any) -> Any:
    """`base` (a params tree, or any tree shaped like one: shardings, specs) with `prompt` as
    `token_embedder/prompt`; the other leaves are `base`'s own."""
    if not isinstance(base, Mapping) or not isinstance(base.get(EMBEDDER), Mapping):
        raise ValueError(f"prompt tuning needs params with a {EMBEDDER!r} embedding module")
    return {**base, EMBEDDER: {**base[EMBEDDER], PROMPT: prompt}}


def virtual_ids(vocab_size: int, length: int) -> jnp.ndarray:
    """`[length]`: the ids that stand for the prompt positions (`vocab_size + i`)."""
    return vocab_size + jnp.arange(length, dtype=jnp.int32)


def _prepend(x: jnp.ndarray, front: jnp.ndarray) -> jnp.ndarray:
    """`front` `[n]` in front of every row of `x` `[b, l]`, in `x`'s dtype."""
    rows = jnp.broadcast_to(front.astype(x.dtype), (x.shape[0], front.shape[0]))
    return jnp.concatenate([rows, x], axis=1)


PACKED_FEATURES = ("encoder_segment_ids", "decoder_segment_ids", "encoder_positions", "decoder_positions")


def prompt_batch(batch: Mapping[str, Any], vocab_size: int, length: int, encoder: bool) -> dict[str, Any]:
    """`batch` with the prompt's virtual ids in front of each row's `encoder_input_tokens`
    (`encoder`: T5; the decoder features are unchanged) or `decoder_input_tokens` (decoder
    models: `decoder_target_tokens` and `decoder_loss_weights` get 0 there, so the prompt adds no
    loss; a prefix LM's `decoder_causal_attention` 1, the prompt joins the prefix). A packed
    batch (segment ids or positions) is refused with a `ValueError`."""
    packed = [k for k in PACKED_FEATURES if batch.get(k) is not None]
    if packed:
        raise ValueError(
            f"prompt tuning does not support packed batches ({', '.join(packed)}): one prompt per row "
            "cannot precede each packed example; train without packing"
        )
    ids = virtual_ids(vocab_size, length)
    out = dict(batch)
    if encoder:
        out["encoder_input_tokens"] = _prepend(jnp.asarray(batch["encoder_input_tokens"]), ids)
        return out
    zeros = jnp.zeros((length,), jnp.int32)
    out["decoder_input_tokens"] = _prepend(jnp.asarray(batch["decoder_input_tokens"]), ids)
    for key, front in (("decoder_target_tokens", zeros), ("decoder_loss_weights", zeros)):
        if batch.get(key) is not None:
            out[key] = _prepend(jnp.asarray(batch[key]), front)
    if batch.get("decoder_causal_attention") is not None:
        out["decoder_causal_attention"] = _prepend(jnp.asarray(batch["decoder_causal_attention"]), zeros + 1)
    return out


def prepend_to_aligned(
    tokens: jnp.ndarray, segments: jnp.ndarray, vocab_size: int, length: int
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Left-aligned decoder prompts (`decoding.prompts.left_align`: padding, segment id 0, in
    front) with the prompt's virtual ids just before each row's first real token, so the row
    stays contiguous at its right end: `[0, ..., 0, virtual ids, start, prompt]`."""
    ids = virtual_ids(vocab_size, length)
    joined = _prepend(tokens, ids)
    valid = _prepend(segments, jnp.ones((length,), jnp.int32))
    order = jnp.argsort(valid, axis=1, stable=True)  # padding (0) first, the rest in its order
    return jnp.take_along_axis(joined, order, axis=1), jnp.take_along_axis(valid, order, axis=1)


class PromptTuningModel:
    """A Cairn model (`EncoderDecoderModel` or `DecoderOnlyModel`) trained through a prompt.

    Its params are `{"token_embedder": {"prompt": [length, embed]}}` (`init_boxed`: with logical
    axes `(None, "embed")`, as the table's embed axis); `frozen_model` is the base model, whose
    params the trainer holds as its frozen tree and passes to `loss_fn(prompt, batch,
    dropout_rng, frozen)`. `merged(prompt, base)` is the prompted params tree the base model
    evaluates and decodes with (`merged_shardings` lays it out the same way)."""

    flops_per_token: Any = None  # training FLOPs per token (MFU), set by whoever knows them

    def __init__(self, model: Any, config: PromptTuningConfig):
        self.frozen_model = model
        self.prompt = config
        self.config = model.config

    def _table(self, *lengths: int) -> jax.ShapeDtypeStruct:
        boxed = jax.eval_shape(lambda: self.frozen_model.init_boxed(jax.random.PRNGKey(0), *lengths))
        return nn.meta.unbox(boxed)[EMBEDDER]["embedding"]

    def init_boxed(self, rng: jax.Array, *lengths: int) -> Any:
        """A `random_uniform` prompt (the configured init needs the base: `initial_params`) as an
        `nn.LogicallyPartitioned` leaf."""
        table = self._table(*lengths)
        config = dataclasses.replace(self.prompt, init="random_uniform", tokens=())
        prompt = init_prompt(rng, jnp.zeros((1, table.shape[1]), table.dtype), config)
        return {EMBEDDER: {PROMPT: nn.LogicallyPartitioned(prompt, (None, "embed"))}}

    def init(self, rng: jax.Array, *lengths: int) -> Any:
        """A fresh `random_uniform` prompt (deterministic given `rng`)."""
        return nn.meta.unbox(self.init_boxed(rng, *lengths))

    def initial_params(self, rng: jax.Array, base: Any) -> Any:
        """The configured initial prompt (`init_prompt` of the base's embedding table)."""
        return {EMBEDDER: {PROMPT: init_prompt(rng, base[EMBEDDER]["embedding"], self.prompt)}}

    def merged(self, params: Any, base: Any) -> Any:
        """The prompted params tree: `base` with the prompt as `token_embedder/prompt`."""
        return with_prompt(base, params[EMBEDDER][PROMPT])

    merged_shardings = merged  # the same insertion on trees of shardings

    def loss_fn(
        self, params: Any, batch: Mapping[str, Any], dropout_rng: jax.Array | None = None, frozen: Any = None
    ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
        """The base model's loss with the prompt in front of every row (`prompt_batch`)."""
        if frozen is None:
            raise ValueError("PromptTuningModel.loss_fn needs the base params (frozen=...)")
        return self.frozen_model.loss_fn(self.merged(params, frozen), batch, dropout_rng)
