"""T5's span corruption (denoising) objective, with the same semantics as T5's preprocessors.

`span_corruption` = `select_random_chunk` -> `reduce_concat_tokens` -> `split_tokens`
(to the token length that `random_spans_helper` computes for the inputs length) ->
`denoise` with `random_spans_noise_mask` (noise density 0.15, mean span 3),
`noise_span_to_unique_sentinel` for the inputs and `nonnoise_span_to_unique_sentinel`
for the targets. Sentinels count down from the vocabulary's last id (`<extra_id_0>`).
All randomness is stateless, seeded per example (see `base.map_over_dataset`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors import seeded_numpy
from cairn.datatasks.preprocessors.base import LengthRule, map_over_dataset, preprocessor
from cairn.datatasks.preprocessors.seeded_numpy import span_corruption_lengths
from cairn.datatasks.tf_data import map_inline, no_autograph


@no_autograph
def stateless_shuffle(value: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Shuffles a 1-D tensor with a stateless seed."""
    order = tf.argsort(tf.random.stateless_uniform(tf.shape(value), seed=seed))
    return tf.gather(value, order)


def random_spans_helper(
    inputs_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """(raw tokens per example, targets length) so the inputs come out `inputs_length` long."""

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_nonnoise = tokens_length - num_noise
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (
            num_nonnoise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def span_corruption_rule(
    sequence_length: Mapping[str, int],
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
    reserved_for_packing: int | None = None,
) -> LengthRule:
    """Span corruption's length rule, stated once: for inputs length `L` (less what is
    reserved for packing) it reads `random_spans_helper(L)[0]` tokens of `targets` per
    example and needs `sequence_length["targets"] >= random_spans_helper(L)[1]`."""
    inputs = sequence_length.get(input_feature_key)
    if inputs is None:
        raise ValueError(
            f"span corruption needs sequence_length[{input_feature_key!r}]; got lengths for {sorted(sequence_length)}"
        )
    inputs -= reserved_for_packing or 0
    if inputs < 3:
        raise ValueError(
            f"sequence_length[{input_feature_key!r}] is {inputs}: span corruption "
            f"needs at least 3 (a token, a sentinel and EOS)"
        )
    tokens_length, targets_length = random_spans_helper(inputs, noise_density, mean_noise_span_length)
    return LengthRule(
        reads={"targets": tokens_length},
        needs={"targets": targets_length},
        about=f"span corruption of inputs length {inputs}",
    )


def _checked_rule(name: str, sequence_length: Mapping[str, int], **kwargs: Any) -> LengthRule:
    """The rule, or `ValueError` naming `name` and the problem when the lengths cannot work."""
    try:
        rule = span_corruption_rule(sequence_length, **kwargs)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    problem = rule.problem(sequence_length)
    if problem:
        raise ValueError(f"{name}: {problem}")
    return rule


@no_autograph
def random_spans_noise_mask(
    length: tf.Tensor, noise_density: float, seeds: tf.Tensor, mean_noise_span_length: float = 3.0
) -> tf.Tensor:
    """A boolean mask of `length` with about `noise_density` noise in spans of mean length."""
    if noise_density == 0.0:
        return tf.zeros([length], tf.bool)
    orig_length = length
    length = tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    num_nonnoise = length - num_noise

    def segmentation(num_items, num_segments, seed):
        first = tf.pad(stateless_shuffle(tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32), seed), [[1, 0]])
        segment_id = tf.cumsum(first)
        return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

    noise_lengths = segmentation(num_noise, num_spans, seeds[0])
    nonnoise_lengths = segmentation(num_nonnoise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [num_spans * 2])
    starts = tf.cumsum(interleaved)[:-1]
    start_indicator = tf.math.unsorted_segment_sum(tf.ones_like(starts), starts, length)
    span_num = tf.cumsum(start_indicator)
    return tf.equal(span_num % 2, 1)[:orig_length]


def sentinel_id(vocabulary: Any) -> int:
    """The id of `<extra_id_0>`: the last id of the vocabulary."""
    return vocabulary.vocab_size - 1


@no_autograph
def noise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any = None
) -> tf.Tensor:
    """Replaces each noise span with one sentinel (counting down from `<extra_id_0>`)."""
    prev_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_noise))
    subsequent_noise = tf.logical_and(noise_mask, prev_noise)
    sentinel = sentinel_id(vocabulary) + 1 - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


@no_autograph
def nonnoise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any = None
) -> tf.Tensor:
    return noise_span_to_unique_sentinel(tokens, tf.logical_not(noise_mask), vocabulary)


def drop_noise_tokens(tokens, noise_mask, vocabulary=None, seeds=None):
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(tokens, noise_mask, vocabulary=None, seeds=None):
    return tf.boolean_mask(tokens, noise_mask)


@preprocessor(deterministic=False)
def select_random_chunk(
    dataset: tf.data.Dataset, max_length: int = 65536, feature_key: str = "targets", seed: Any = None
) -> tf.data.Dataset:
    """Drops empty examples and keeps one random `max_length` chunk of `feature_key`."""
    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))

    @map_over_dataset(num_seeds=1)
    def chunk(x, seed):
        tokens = x[feature_key]
        n = tf.shape(tokens)[0]
        num_segments = tf.cast(tf.math.ceil(n / max_length), tf.int32)
        start = max_length * tf.random.stateless_uniform([], seed, maxval=num_segments, dtype=tf.int32)
        return {feature_key: tokens[start : tf.minimum(start + max_length, n)]}

    return chunk(dataset, seed=seed)


@preprocessor(deterministic=True)
def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128
) -> tf.data.Dataset:
    """Concatenates the tokens of `batch_size` consecutive examples (padding removed)."""
    dataset = map_inline(dataset, lambda x: {feature_key: x[feature_key]})
    dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

    @no_autograph
    def concat(x):
        tokens = tf.reshape(x[feature_key], [-1])
        return {feature_key: tf.boolean_mask(tokens, tf.cast(tokens, tf.bool))}

    return map_inline(dataset, concat)


@preprocessor(deterministic=True)
def split_tokens(
    dataset: tf.data.Dataset, max_tokens_per_segment: int, feature_key: str = "targets"
) -> tf.data.Dataset:
    """Splits `feature_key` into consecutive segments of `max_tokens_per_segment` tokens."""
    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))
    length = max_tokens_per_segment

    @no_autograph
    def split(x):
        tokens = x[feature_key]
        n = tf.shape(tokens)[0]
        num_segments = tf.cast(tf.math.ceil(n / length), tf.int32)
        padding = num_segments * length - n
        lengths = tf.concat([tf.repeat(length, num_segments - 1), [length - padding]], axis=0)
        padded = tf.reshape(tf.pad(tokens, [[0, padding]]), [-1, length])
        return {feature_key: padded, "__length__": lengths}

    dataset = map_inline(dataset, split)
    return map_inline(dataset.unbatch(), lambda x: {feature_key: x[feature_key][: x["__length__"]]})


def denoise(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, Any],
    noise_density: float,
    noise_mask_fn: Callable,
    inputs_fn: Callable,
    targets_fn: Callable | None = None,
    input_feature_key: str = "inputs",
    seed: Any = None,
) -> tf.data.Dataset:
    """Builds (inputs, targets) from `targets` tokens with a noise mask (T5's `denoise`)."""
    vocabulary = output_features["targets"].vocabulary
    if input_feature_key in output_features and output_features[input_feature_key].vocabulary != vocabulary:
        raise ValueError("denoise: the inputs and targets features must share a vocabulary")

    @map_over_dataset(num_seeds=6)
    def one(x, seeds):
        tokens = x["targets"]
        mask = noise_mask_fn(tf.size(tokens), noise_density, seeds=seeds[:2])
        inputs = inputs_fn(tokens, mask, vocabulary, seeds=seeds[2:4])
        targets = targets_fn(tokens, mask, vocabulary, seeds=seeds[4:6]) if targets_fn else tokens
        out = {k: v for k, v in x.items() if k not in (input_feature_key, "targets")}
        out.update({input_feature_key: inputs, "targets": targets})
        return out

    return one(dataset, seed=seed)


denoise.deterministic = False  # type: ignore[attr-defined]


def _split_seed(seed: Any, n: int) -> list:
    from cairn.datatasks.preprocessors.base import base_key

    key = base_key(seed)
    return [tf.random.experimental.stateless_fold_in(key, i) for i in range(n)]


@preprocessor(deterministic=False, reads=("targets",), writes=("inputs", "targets"), length_rule=span_corruption_rule)
def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    mean_noise_span_length: float = 3.0,
    noise_density: float = 0.15,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
    reserved_for_packing: int | None = None,
    seed: Any = None,
) -> tf.data.Dataset:
    """T5's span corruption: `targets` tokens -> (inputs with sentinels, targets with spans)."""
    tokens_length = _checked_rule(
        "span_corruption",
        sequence_length,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
        input_feature_key=input_feature_key,
        reserved_for_packing=reserved_for_packing,
    ).reads["targets"]
    chunk_seed, denoise_seed = _split_seed(seed, 2)
    ds = select_random_chunk(dataset, max_length=65536, feature_key="targets", seed=chunk_seed)
    if merge_examples_to_reduce_padding:
        ds = reduce_concat_tokens(ds, feature_key="targets", batch_size=128)
    ds = split_tokens(ds, max_tokens_per_segment=tokens_length, feature_key="targets")

    @no_autograph
    def mask_fn(length, density, seeds):
        return random_spans_noise_mask(length, density, seeds, mean_noise_span_length)

    return denoise(
        ds,
        output_features,
        noise_density,
        mask_fn,
        inputs_fn=noise_span_to_unique_sentinel,
        targets_fn=nonnoise_span_to_unique_sentinel,
        input_feature_key=input_feature_key,
        seed=denoise_seed,
    )


# -- one-to-one variants for deterministic pipelines (post-cache) ---------------------------
def _span_corruption_one_to_one_lengths(
    lengths,
    sequence_length,
    output_features,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
):
    import numpy as np

    tokens_length = span_corruption_rule(
        sequence_length, noise_density, mean_noise_span_length, input_feature_key
    ).reads["targets"]
    n = np.minimum(np.asarray(lengths["targets"]), tokens_length)
    inputs, targets = span_corruption_lengths(n, noise_density, mean_noise_span_length)
    out = dict(lengths)
    out.update({input_feature_key: inputs.astype(np.int32), "targets": targets.astype(np.int32)})
    return out


def _span_corruption_one_to_one_numpy(
    features,
    sequence_length,
    output_features,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
    seed: Any = None,
):
    """`span_corruption_one_to_one` in NumPy (`seeded_numpy.span_corruption`), bit-identical."""
    kwargs: dict[str, Any] = dict(
        noise_density=noise_density, mean_noise_span_length=mean_noise_span_length, input_feature_key=input_feature_key
    )
    tokens_length = _checked_rule("span_corruption_one_to_one", sequence_length, **kwargs).reads["targets"]
    return seeded_numpy.span_corruption(features, output_features, tokens_length, seed=seed, **kwargs)


@preprocessor(
    deterministic=False,
    reads=("targets",),
    writes=("inputs", "targets"),
    length_rule=span_corruption_rule,
    output_lengths=_span_corruption_one_to_one_lengths,
    numpy_fn=_span_corruption_one_to_one_numpy,
)
def span_corruption_one_to_one(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
    seed: Any = None,
) -> tf.data.Dataset:
    """T5's span corruption, one example in, one out (usable after a deterministic cache).

    Each example's `targets` tokens (e.g. fixed-length chunks cached by `reduce_concat_tokens`
    + `split_tokens`) are cropped at a seeded random offset to the number of tokens that
    fill `sequence_length[input_feature_key]` (`random_spans_helper`, EOS included), then
    noised as `span_corruption` does (noise density 0.15, mean span 3, sentinels from the
    vocabulary's top). Shorter examples are used whole. Follow it with
    `append_eos_after_trim`. Lengths are a function of the input length only, so packing
    can be planned (`span_corruption_one_to_one.deterministic_lengths`).
    """
    tokens_length = _checked_rule(
        "span_corruption_one_to_one",
        sequence_length,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
        input_feature_key=input_feature_key,
    ).reads["targets"]

    @no_autograph
    def mask_fn(length, density, seeds):
        return random_spans_noise_mask(length, density, seeds, mean_noise_span_length)

    @map_over_dataset(num_seeds=1)
    @no_autograph
    def crop(x, seed):
        tokens = x["targets"]
        n = tf.shape(tokens)[0]
        room = tf.maximum(n - tokens_length, 0)
        start = tf.random.stateless_uniform([], seed, maxval=room + 1, dtype=tf.int32)
        out = dict(x)
        out["targets"] = tokens[start : start + tokens_length]
        return out

    crop_seed, denoise_seed = _split_seed(seed, 2)
    ds = crop(dataset, seed=crop_seed)
    return denoise(
        ds,
        output_features,
        noise_density,
        mask_fn,
        inputs_fn=noise_span_to_unique_sentinel,
        targets_fn=nonnoise_span_to_unique_sentinel,
        input_feature_key=input_feature_key,
        seed=denoise_seed,
    )
