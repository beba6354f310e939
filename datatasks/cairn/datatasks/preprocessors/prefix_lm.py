"""T5's `prefix_lm` objective: split a token stream into a prefix (inputs) and a suffix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors.base import preprocessor
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
