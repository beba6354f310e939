"""T5's `prefix_lm` objective: split a token stream into a prefix (inputs) and a suffix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors import seeded_numpy
from cairn.datatasks.preprocessors.base import map_over_dataset, preprocessor
from cairn.datatasks.preprocessors.span_corruption import (
    _split_seed,
    denoise,
    drop_noise_tokens,
    drop_nonnoise_tokens,
    select_random_chunk,
    split_tokens,
)


def random_prefix_noise_mask(length: tf.Tensor, noise_density: float, seeds: tf.Tensor) -> tf.Tensor:
    """Noise is a suffix whose start is uniform in a range centred on `1 - noise_density`."""
    if noise_density > 0.5:
        raise NotImplementedError("random_prefix_noise_mask needs noise_density <= 0.5")
    max_input_tokens = length - 1
    min_input_tokens = tf.minimum(
        max_input_tokens,
        tf.maximum(
            1, tf.cast(tf.math.round((1 - 2 * noise_density) * tf.cast(max_input_tokens, tf.float32)), tf.int32)
        ),
    )
    num_input_tokens = tf.random.stateless_uniform(
        [], minval=min_input_tokens, maxval=max_input_tokens + 1, dtype=tf.int32, seed=seeds[0]
    )
    return tf.range(length, dtype=tf.int32) >= num_input_tokens


@preprocessor(deterministic=False)
def prefix_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    noise_density: float = 0.5,
    seed: Any = None,
) -> tf.data.Dataset:
    """`targets` tokens -> inputs (a random prefix) and targets (the rest), as in T5."""
    max_tokens = sequence_length["inputs"]
    if output_features["inputs"].add_eos:
        max_tokens -= 1
    chunk_seed, denoise_seed = _split_seed(seed, 2)
    ds = select_random_chunk(dataset, max_length=65536, feature_key="targets", seed=chunk_seed)
    ds = split_tokens(ds, max_tokens_per_segment=max_tokens, feature_key="targets")
    return denoise(
        ds,
        output_features,
        noise_density,
        random_prefix_noise_mask,
        inputs_fn=drop_noise_tokens,
        targets_fn=drop_nonnoise_tokens,
        seed=denoise_seed,
    )


# -- one-to-one variant for deterministic pipelines (post-cache) ----------------------------
def _prefix_room(sequence_length: Mapping[str, int], output_features: Mapping[str, Any]) -> tuple[int, int]:
    """Tokens of the prefix and of the suffix: each feature's length, less one for its EOS."""
    eos = lambda k: 1 if k in output_features and output_features[k].add_eos else 0
    return int(sequence_length["inputs"]) - eos("inputs"), int(sequence_length["targets"]) - eos("targets")


def _prefix_lm_lengths(lengths, sequence_length, output_features):
    import numpy as np

    prefix, suffix = _prefix_room(sequence_length, output_features)
    n = np.minimum(np.asarray(lengths["targets"]), prefix + suffix)
    out = dict(lengths)
    out["inputs"] = np.minimum(n, prefix).astype(np.int32)
    out["targets"] = (n - out["inputs"]).astype(np.int32)
    return out


def _prefix_lm_numpy(features, sequence_length, output_features, seed=None):
    """`prefix_lm_one_to_one` in NumPy (`seeded_numpy.prefix_lm`), bit-identical."""
    return seeded_numpy.prefix_lm(features, *_prefix_room(sequence_length, output_features), seed=seed)


@preprocessor(
    deterministic=False,
    reads=("targets",),
    writes=("inputs", "targets"),
    output_lengths=_prefix_lm_lengths,
    numpy_fn=_prefix_lm_numpy,
)
def prefix_lm_one_to_one(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    seed: Any = None,
) -> tf.data.Dataset:
    """A prefix LM example from each example's `targets` tokens, one in, one out (usable after
    a deterministic cache of fixed-length chunks, as `span_corruption_one_to_one`).

    A window of as many tokens as the inputs and targets hold (each less one for its EOS)
    starts at a seeded random offset; its first `inputs` tokens are the prefix (inputs), the rest
    the suffix (targets). Shorter examples are used whole, the prefix first. Unlike `prefix_lm`,
    the split point is fixed, so the lengths are a function of the input length (packing is
    planned from the cache). Follow it with `append_eos_after_trim`.
    """
    prefix, suffix = _prefix_room(sequence_length, output_features)

    @map_over_dataset(num_seeds=1)
    def split(x, seed):
        tokens = x["targets"]
        room = tf.maximum(tf.shape(tokens)[0] - (prefix + suffix), 0)
        start = tf.random.stateless_uniform([], seed, maxval=room + 1, dtype=tf.int32)
        window = tokens[start : start + prefix + suffix]
        out = dict(x)
        out["inputs"], out["targets"] = window[:prefix], window[prefix:]
        return out

    return split(dataset, seed=seed)
