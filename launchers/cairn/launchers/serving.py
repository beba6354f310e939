"""The `tf.Module` that `//launchers:export` saves: strings in, decoded strings and scores out,
with the model (jax2tf, native serialization) and the vocabulary (`cairn.tokenizers`'
`SentencePieceGraph`: plain TensorFlow ops) inside, so that TensorFlow alone serves it.

Signatures (`serving_module`):

- `serving_default(inputs: string[n]) -> {outputs: string[n], scores: float32[n],
  output_ids: int32[n, new_tokens]}`: decoded with the exported `post_training.*` options and the
  config's `seed` (what `infer` uses);
- `generate(inputs: string[n], seed: int32[]) -> the same`: another seed for sampling.

`n` is any size: the rows go through the model `batch_size` at a time (the last batch padded
with empty rows). An input is tokenized as the task does: an encoder-decoder model's is cut to
`input_length - 1` tokens and gets EOS when the task's `inputs` feature adds it (else cut to
`input_length`); a decoder-only model's prompt (no EOS) keeps its last `input_length` tokens
(`prompt_limit`'s truncation, as infer's). With `refuse_long` (`post_training.long_inputs=refuse`)
a longer prompt fails the call instead, and an input of more than `max_input_chars` characters
always does, before it is tokenized: `InvalidArgumentError` naming the input's index, its
length and the limit. The signatures take a vector of strings: another rank fails the call
(`InvalidArgumentError`: "inputs must be a vector of strings"), another dtype is refused by
TensorFlow before the graph runs ("input #0 ... was expected to be a string tensor but is a
int32 tensor").
An output is the prediction up to its first EOS or padding, without the prompt, decoded as
`infer` decodes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cairn.tokenizers.sentencepiece_graph import SentencePieceGraph


@dataclasses.dataclass(frozen=True)
class ServingShape:
    """What is fixed at export: `batch_size` rows per model call, prompts of `input_length`
    tokens, predictions of at most `new_tokens`; `continues_prompt` (decoder-only), `add_eos`
    (encoder inputs end with EOS), `eos_id`, `seed`, `serving_default`'s seed; `refuse_long`: a
    prompt longer than `input_length` fails (else it is truncated); `max_input_chars`: longer
    inputs fail (0: no limit)."""

    batch_size: int
    input_length: int
    new_tokens: int
    continues_prompt: bool
    add_eos: bool
    eos_id: int
    seed: int
    refuse_long: bool = False
    max_input_chars: int = 0

    @property
    def output_length(self) -> int:
        """The columns `predict_batch` returns: a decoder-only model's prompt and continuation."""
        return self.new_tokens + (self.input_length if self.continues_prompt else 0)


def serving_module(
    decode_fn: Callable,
    params: Any,
    vocabulary: Any,
    vocabulary_file: str,
    shape: ServingShape,
) -> tuple[Any, dict[str, Any]]:
    """`(the tf.Module to save, its signatures)` (module docstring; the concrete functions by
    signature name). `decode_fn(params, prompts [B, W] int32, seed int32) -> (tokens [B,
    output_length] int32, scores [B] float32)` is the jax2tf-converted `predict_batch`; `params`
    its parameters (numpy arrays, kept as variables); `vocabulary` the task's `cairn.tokenizers`
    vocabulary (its `clean_ids_tf` is plain TensorFlow); `vocabulary_file`, the serialized
    SentencePiece model, is kept as an asset."""
    import tensorflow as tf

    module = tf.Module(name="cairn_serving")
    module.params = tf.nest.map_structure(lambda a: tf.Variable(a, trainable=False), params)
    tokenizer = SentencePieceGraph(vocabulary.sp_model)
    module.tokenizer_tables = tokenizer.tables  # tracked, so that the functions' tables are saved
    module.vocabulary_asset = tf.saved_model.Asset(vocabulary_file)
    strings = tf.TensorSpec(None, tf.string, name="inputs")  # any rank: `_vector` checks it
    seed_spec = tf.TensorSpec([], tf.int32, name="seed")
    # Traced once (the model converted once) and shared by both signatures.
    module.decode = tf.function(
        lambda prompts, seed: decode_fn(module.params, prompts, seed),
        input_signature=[tf.TensorSpec([shape.batch_size, shape.input_length], tf.int32), seed_spec],
        autograph=False,
    )

    def run(inputs: Any, seed: Any) -> dict[str, Any]:
        inputs = _vector(tf, inputs)
        prompts = _prompts(tf, tokenizer, inputs, shape)
        n = tf.shape(prompts)[0]
        chunks = (n + shape.batch_size - 1) // shape.batch_size
        padded = tf.pad(prompts, [[0, chunks * shape.batch_size - n], [0, 0]])
        batches = tf.reshape(padded, [chunks, shape.batch_size, shape.input_length])
        tokens, scores = tf.map_fn(
            lambda x: module.decode(x, seed),
            batches,
            fn_output_signature=(
                tf.TensorSpec([shape.batch_size, shape.output_length], tf.int32),
                tf.TensorSpec([shape.batch_size], tf.float32),
            ),
        )
        tokens = tf.reshape(tokens, [-1, shape.output_length])[:n]
        scores = tf.reshape(scores, [-1])[:n]
        if shape.continues_prompt:  # the prompt (its leading non-zero tokens) removed
            starts = tf.reduce_sum(tf.math.cumprod(tf.cast(prompts != 0, tf.int32), axis=1), axis=1)
            tokens = tf.gather(tokens, starts[:, None] + tf.range(shape.new_tokens)[None, :], batch_dims=1)
        tokens = tokens * tf.math.cumprod(tf.cast(tokens != 0, tf.int32), axis=1)  # nothing after a 0
        texts = tokenizer.decode(vocabulary.clean_ids_tf(tokens))
        return {"outputs": texts, "scores": scores, "output_ids": tokens}

    module.generate = tf.function(run, input_signature=[strings, seed_spec])
    module.serving_default = tf.function(
        lambda inputs: module.generate(inputs, tf.constant(shape.seed, tf.int32)), input_signature=[strings]
    )
    signatures = {
        "serving_default": module.serving_default.get_concrete_function(),
        "generate": module.generate.get_concrete_function(),
    }
    return module, signatures


def _vector(tf: Any, inputs: Any) -> Any:
    """`inputs` as a vector `[n]`, or an `InvalidArgumentError` saying that it must be one (the
    signature takes any rank, so that the message is this one, not a failure inside the graph)."""
    rank = tf.rank(inputs)
    check = tf.debugging.Assert(
        tf.equal(rank, 1), ["inputs must be a vector of strings (rank 1, shape [n]); got rank", rank]
    )
    with tf.control_dependencies([check]):
        return tf.reshape(inputs, [-1])


def _refuse_over(tf: Any, lengths: Any, limit: int, what: str) -> Any:
    """An assertion that every entry of `lengths` `[n]` is at most `limit`, its message naming the
    first that is not (its index and length)."""
    over = lengths > limit
    first = tf.argmax(tf.concat([tf.cast(over, tf.int32), [1]], 0), output_type=tf.int32)
    longest = tf.gather(tf.concat([tf.cast(lengths, tf.int64), [0]], 0), first)
    return tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(over)), ["input", first, "has", longest, f"{what}, more than {limit}"]
    )


def _prompts(tf: Any, tokenizer: SentencePieceGraph, inputs: Any, shape: ServingShape) -> Any:
    """`[n, input_length]` int32 prompts of `inputs` (module docstring), right-padded with 0."""
    if shape.max_input_chars:
        chars = tf.strings.length(inputs, unit="UTF8_CHAR")
        with tf.control_dependencies([_refuse_over(tf, chars, shape.max_input_chars, "characters (max_input_chars)")]):
            inputs = tf.identity(inputs)
    ids = tokenizer.encode(inputs)
    n = tf.shape(inputs)[0]
    checks = []
    if shape.refuse_long:
        tokens = ids.row_lengths() + (1 if shape.add_eos and not shape.continues_prompt else 0)
        checks.append(_refuse_over(tf, tokens, shape.input_length, "tokens (post_training.long_inputs='refuse')"))
    if shape.continues_prompt:
        ids = ids[:, -shape.input_length :]
    elif shape.add_eos:
        ids = tf.concat([ids[:, : shape.input_length - 1], tf.fill([n, 1], shape.eos_id)], axis=1)
    else:
        ids = ids[:, : shape.input_length]
    with tf.control_dependencies(checks):
        return tf.identity(ids.to_tensor(default_value=0, shape=[None, shape.input_length]))
