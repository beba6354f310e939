"""NumPy twins (`Preprocessor.numpy_fn`) of the seeded one-to-one preprocessors that run
after a deterministic cache: `random_crop` and `span_corruption_one_to_one`. No TensorFlow.

A seeded `numpy_fn` gets a batch of examples (`{feature: Ragged}`) and `seed` `[N, 2]`:
example `i`'s own preprocessor seed, the one `Task.preprocess` hands the TensorFlow
preprocessor when the example is alone in its stream (as the deterministic reader's
TensorFlow stage runs each record), so each example is example 0 of its stream. Every
random draw repeats, bit for bit, what the TensorFlow op gives on CPU (`stateless_numpy`):
the outputs equal the TensorFlow preprocessors' for every example and seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn.datatasks import stateless_numpy as sn
from cairn.datatasks.ragged import Ragged


# -- seeds as `base.map_over_dataset` and `span_corruption._split_seed` derive them ----------
def _base_key(seed: Any) -> np.ndarray:
    if seed is None:
        raise ValueError("a seeded numpy_fn needs `seed` ([N, 2]: each example's own seed)")
    seed = np.asarray(seed)
    if seed.ndim != 2 or seed.shape[1] != 2 or seed.dtype.kind != "i":
        raise ValueError(f"`seed` must be [N, 2] integers, one seed per example; got {seed.dtype} {seed.shape}")
    return seed.astype(np.int64)


def example_seeds(seed: Any, num_seeds: int) -> np.ndarray:
    """`[N, num_seeds, 2]` int32: what `map_over_dataset(num_seeds=...)` gives example 0 of
    a stream seeded `seed[i]` (`split(fold_in(key, 0), num_seeds)` cast to int32)."""
    folded = sn.fold_in(_base_key(seed), 0, np.int64)
    return sn.split(folded, num_seeds).astype(np.int32)


def split_seed(seed: Any, n: int) -> list[np.ndarray]:
    """`span_corruption._split_seed`: `[fold_in(seed, j) for j < n]`, each `[N, 2]` int32."""
    key = _base_key(seed)
    return [sn.fold_in(key, j, np.int32) for j in range(n)]


# -- ragged helpers --------------------------------------------------------------------------
def _row_ids(lengths: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(lengths.size), lengths)


def _window(r: Ragged, start: np.ndarray, size: int) -> Ragged:
    """Row `i` sliced `[start[i] : start[i] + size]` (TensorFlow's/Python's slice rules)."""
    n = r.lengths
    begin = np.minimum(start, n)
    end = start + size
    end = np.clip(np.where(end < 0, end + n, end), 0, n)
    lengths = np.maximum(end - begin, 0)
    first = r.offsets[:-1] + begin
    idx = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(first - np.cumsum(lengths) + lengths, lengths)
    return Ragged(r.values[idx], lengths.astype(np.int64))


def _crop(r: Ragged, seeds: np.ndarray, keep: int) -> Ragged:
    """A window of `keep` at a uniform start in `[0, max(n - keep, 0)]` (int32 draw)."""
    room = np.maximum(r.lengths - keep, 0)
    start = sn.uniform_int(seeds, (), 0, (room + 1).astype(np.int32), np.int32)
    return _window(r, start.astype(np.int64), keep)


# -- random_crop -------------------------------------------------------------------------------
def random_crop(
    features: Mapping[str, Ragged],
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    feature_key: str = "targets",
    seed: Any = None,
) -> dict[str, Ragged]:
    """`basic.random_crop` on a batch: each example's seeded window of `feature_key`."""
    feature = output_features.get(feature_key)
    eos = 1 if feature is not None and feature.add_eos else 0
    keep = int(sequence_length[feature_key]) - eos
    out = dict(features)
    out[feature_key] = _crop(features[feature_key], example_seeds(seed, 1)[:, 0], keep)
    return out


# -- prefix LM ---------------------------------------------------------------------------------
def prefix_lm(features: Mapping[str, Ragged], prefix: int, suffix: int, seed: Any = None) -> dict[str, Ragged]:
    """`prefix_lm.prefix_lm_one_to_one` on a batch: each example's seeded window of `prefix +
    suffix` `targets` tokens, its first `prefix` the inputs, the rest the targets."""
    window = _crop(features["targets"], example_seeds(seed, 1)[:, 0], prefix + suffix)
    out = dict(features)
    out["inputs"] = _window(window, np.zeros(window.lengths.size, np.int64), prefix)
    out["targets"] = _window(window, np.full(window.lengths.size, prefix, np.int64), suffix)
    return out


# -- span corruption ---------------------------------------------------------------------------
def span_counts(length: Any, noise_density: float, mean_noise_span_length: float) -> tuple[np.ndarray, np.ndarray]:
    """(num_noise, num_spans) of `random_spans_noise_mask` for lengths >= 2 (float32
    rounding as in the TF op)."""
    length = np.maximum(np.asarray(length, np.int64), 2)
    num_noise = np.round(length.astype(np.float32) * np.float32(noise_density)).astype(np.int64)
    num_noise = np.minimum(np.maximum(num_noise, 1), length - 1)
    num_spans = np.round(num_noise.astype(np.float32) / np.float32(mean_noise_span_length))
    return num_noise, np.maximum(num_spans.astype(np.int64), 1)


def span_corruption_lengths(
    tokens_length: Any, noise_density: float = 0.15, mean_noise_span_length: float = 3.0
) -> tuple[np.ndarray, np.ndarray]:
    """`(inputs, targets)` lengths (no EOS) that span corruption makes of `tokens_length` tokens."""
    n = np.asarray(tokens_length, np.int64)
    num_noise, num_spans = span_counts(n, noise_density, mean_noise_span_length)
    inputs = np.where(n >= 2, n - num_noise + num_spans, n)
    targets = np.where(n >= 2, num_noise + num_spans, np.minimum(n, 1))
    return inputs, targets


def _segments(num_items: np.ndarray, num_segments: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The segment lengths (flat, `num_segments[i]` for row `i`) of the TF op's
    `segmentation`: `num_items` split at the positions where a stateless shuffle (argsort
    of float32 uniforms) of `[1] * (num_segments - 1) + [0] * ...` has a 1."""
    m = num_items - 1
    if np.any(num_segments - 1 > m):
        raise ValueError("random_spans_noise_mask: more noise spans than tokens to split (TensorFlow fails too)")
    words = sn.ragged_words(seeds, m)
    rows = _row_ids(m)
    # The float32 is (word & 0x7FFFFF) / 2**23 exactly: the same order, the same ties.
    order = np.argsort((rows << 23) | (words & np.uint32(0x7FFFFF)).astype(np.int64), kind="stable")
    first_m = np.cumsum(m) - m
    is_one = order - np.repeat(first_m, m) < np.repeat(num_segments - 1, m)
    # A segment starts at each row's item 0 and after each sorted position holding a 1.
    starts = np.empty(int(num_items.sum()), bool)
    row_start = np.cumsum(num_items) - num_items
    starts[row_start] = True
    rest = np.ones(starts.size, bool)
    rest[row_start] = False
    starts[rest] = is_one
    return np.bincount(np.cumsum(starts) - 1, minlength=int(num_segments.sum()))


def noise_mask(lengths: np.ndarray, noise_density: float, mean_noise_span_length: float, seeds: np.ndarray) -> Ragged:
    """`random_spans_noise_mask` of each row's length, seeded `seeds [N, 2, 2]` (a row's
    `seeds[:2]`): a bool `Ragged`, True on noise."""
    lengths = np.asarray(lengths, np.int64)
    if noise_density == 0.0:
        return Ragged(np.zeros(int(lengths.sum()), bool), lengths)
    padded = np.maximum(lengths, 2)
    num_noise, num_spans = span_counts(lengths, noise_density, mean_noise_span_length)
    noise = _segments(num_noise, num_spans, seeds[:, 0])
    nonnoise = _segments(padded - num_noise, num_spans, seeds[:, 1])
    runs = np.stack([nonnoise, noise], axis=1).reshape(-1)  # per row: b0, a0, b1, a1, ...
    flags = np.tile(np.array([False, True]), nonnoise.size)
    return Ragged(np.repeat(flags, runs), padded).head(lengths)


def to_sentinels(tokens: Ragged, mask: np.ndarray, sentinel: int) -> Ragged:
    """`noise_span_to_unique_sentinel`: each run of `mask` (flat, aligned with `tokens`)
    becomes one id, counting down from `sentinel` within each row."""
    row_start = np.zeros(mask.size, bool)
    row_start[(tokens.offsets[:-1])[tokens.lengths > 0]] = True
    prev = np.zeros_like(mask)
    prev[1:] = mask[:-1]
    prev &= ~row_start
    first = mask & ~prev
    counts = np.zeros(mask.size + 1, np.int64)
    np.cumsum(first, out=counts[1:])
    before = np.repeat(counts[tokens.offsets[:-1]], tokens.lengths)
    counts = counts[1:]
    values = tokens.values
    ids = np.where(first, (sentinel + 1 - (counts - before)).astype(values.dtype), values)
    keep = ~(mask & prev)
    dropped = np.bincount(_row_ids(tokens.lengths)[~keep], minlength=tokens.lengths.size)
    return Ragged(ids[keep], tokens.lengths - dropped)


def span_corruption(
    features: Mapping[str, Ragged],
    output_features: Mapping[str, Any],
    tokens_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
    seed: Any = None,
) -> dict[str, Ragged]:
    """`span_corruption_one_to_one` on a batch, its tokens length given: the seeded crop of
    `targets` to `tokens_length`, then `denoise` (noise spans -> sentinels in the inputs,
    the rest -> sentinels in the targets)."""
    vocabulary = output_features["targets"].vocabulary
    if input_feature_key in output_features and output_features[input_feature_key].vocabulary != vocabulary:
        raise ValueError("denoise: the inputs and targets features must share a vocabulary")
    crop_seed, denoise_seed = split_seed(seed, 2)
    tokens = _crop(features["targets"], example_seeds(crop_seed, 1)[:, 0], tokens_length)
    mask = noise_mask(tokens.lengths, noise_density, mean_noise_span_length, example_seeds(denoise_seed, 6)[:, :2])
    top = vocabulary.vocab_size - 1
    out = {k: v for k, v in features.items() if k not in (input_feature_key, "targets")}
    out[input_feature_key] = to_sentinels(tokens, mask.values, top)
    out["targets"] = to_sentinels(tokens, ~mask.values, top)
    return out
