"""Trimming, padding and packing of token features, with seqio's semantics.

`trim_and_pack_dataset` packs greedily, in order, within groups of `max(lengths)`
consecutive examples (seqio's `padded_batch` + `_pack_with_tf_ops`): an example joins the
current row when every feature still fits, otherwise the row is emitted and a new one
starts; the last row of a group is emitted at the group's end. Each feature of an example
is first cut at its count of non-zero ids, then to the feature's length. `<k>_positions`
restart at 0 for every example and `<k>_segment_ids` count examples from 1 (0 on padding).
The packing runs in NumPy (`pack_rows`, vectorised over a group) inside one
`tf.numpy_function` per group (stateful=False, so iterators stay checkpointable) instead of
a `tf.while_loop`: same rows, much faster. The deterministic reader packs with the same
`pack_rows`, through the converters' `convert_numpy`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.ragged import Ragged
from cairn.datatasks.tf_data import map_inline, no_autograph

_PAD_BATCH = 256


def trim_and_pad_dataset(ds: tf.data.Dataset, feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    """Trims the features in `feature_lengths` to their length and pads them with 0.

    Runs on batches of examples (`padded_batch`, then `unbatch`); other features pass.
    """
    keys = list(feature_lengths)
    spec = ds.element_spec
    if any(spec[k].shape.rank != 1 for k in keys) or any(
        s.shape.rank is None or s.shape.rank > 1 for k, s in spec.items() if k not in keys
    ):
        return map_inline(ds, lambda x: _pad_one(x, feature_lengths))

    @no_autograph
    def fn(batch):
        out = dict(batch)
        for k in keys:
            n = feature_lengths[k]
            v = batch[k][:, :n]
            v = tf.pad(v, [[0, 0], [0, n - tf.shape(v)[1]]])
            v.set_shape([None, n])
            out[k] = v
        return out

    ds = map_inline(ds.padded_batch(_PAD_BATCH), fn)
    return ds.unbatch()


def _pad_one(x: dict, feature_lengths: Mapping[str, int]) -> dict:
    out = dict(x)
    for k, n in feature_lengths.items():
        v = x[k][:n]
        v = tf.pad(v, [[0, n - tf.shape(v)[0]]] + [[0, 0]] * (v.shape.rank - 1))
        v.set_shape([n] + v.shape[1:].as_list())
        out[k] = v
    return out


def nonzero_counts(r: Ragged) -> np.ndarray:
    """The number of non-zero ids of each example."""
    cum = np.zeros(r.values.size + 1, np.int64)
    np.cumsum(r.values != 0, out=cum[1:])
    offsets = r.offsets
    return cum[offsets[1:]] - cum[offsets[:-1]]


def pack_rows(
    examples: Mapping[str, Ragged], row_sizes: np.ndarray, lengths: Mapping[str, int]
) -> dict[str, np.ndarray]:
    """Packs consecutive examples into rows: row `r` holds the next `row_sizes[r]` examples.

    Each feature `k` of an example keeps its first `count of non-zero ids` values (at most
    `lengths[k]`); the row gets `k`, `k_positions` and `k_segment_ids`, each `[rows,
    lengths[k]]` int32 (see the module docstring). The one packer of the library: the
    streaming path (`pack_group`) and the deterministic reader (through the converters'
    `convert_numpy`) both call it. Raises `DataTasksError` when a row overflows.
    """
    row_sizes = np.asarray(row_sizes, np.int64)
    n_rows = row_sizes.size
    row_of = np.repeat(np.arange(n_rows), row_sizes)
    first = np.zeros(n_rows + 1, np.int64)
    np.cumsum(row_sizes, out=first[1:])
    out: dict[str, np.ndarray] = {}
    for k, width in lengths.items():
        r = examples[k]
        if len(r) != row_of.size:
            raise DataTasksError(f"pack_rows: {len(r)} examples of {k!r}, the rows hold {row_of.size}")
        r = r.head(np.minimum(nonzero_counts(r), width))
        ends = np.cumsum(r.lengths)
        row_start = np.concatenate([[0], ends])[first[:-1]]  # tokens before each row
        used = np.concatenate([[0], ends])[first[1:]] - row_start
        if (used > width).any():
            bad = int(np.argmax(used > width))
            raise DataTasksError(f"packed row {bad} needs {int(used[bad])} {k!r} ids, more than its length {width}")
        offsets = r.offsets[:-1]
        pos = np.arange(r.values.size, dtype=np.int64) - np.repeat(offsets, r.lengths)
        col = np.repeat(offsets - row_start[row_of], r.lengths) + pos
        row = np.repeat(row_of, r.lengths)
        tokens = np.zeros((n_rows, width), np.int32)
        positions = np.zeros((n_rows, width), np.int32)
        tokens[row, col] = r.values
        positions[row, col] = pos
        out[k] = tokens
        out[k + "_positions"] = positions
        out[k + "_segment_ids"] = np.cumsum(positions == 0, axis=1, dtype=np.int32) * (tokens != 0)
    return out


def greedy_row_sizes(units: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Sizes of the rows greedy in-order packing makes of examples with `units` [N, K]
    (per feature) in rows of `capacity` [K]: a row closes when the next example does not fit."""
    sizes: list[int] = []
    used = np.zeros_like(capacity)
    count = 0
    for u in units:
        if count and (used + u > capacity).any():
            sizes.append(count)
            used, count = np.zeros_like(capacity), 0
        used = used + u
        count += 1
    if count:
        sizes.append(count)
    return np.asarray(sizes, np.int64)


def pack_group(batch: Mapping[str, np.ndarray], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Packs one padded batch `{k: [B, L_k]}` into rows; see the module docstring."""
    keys = list(lengths)
    examples, units = {}, []
    for k in keys:
        v = np.asarray(batch[k], np.int32)
        examples[k] = Ragged(v.reshape(-1), np.full(v.shape[0], v.shape[1], np.int64))
        units.append(np.minimum(np.count_nonzero(v, axis=1), lengths[k]))
    sizes = greedy_row_sizes(np.stack(units, 1), np.array([lengths[k] for k in keys], np.int64))
    return pack_rows(examples, sizes, lengths)


def autoregressive_inputs(targets: np.ndarray, segment_ids: np.ndarray | None = None, bos_id: int = 0) -> np.ndarray:
    """`make_autoregressive_inputs` on `[rows, L]` arrays in NumPy: targets shifted right,
    `bos_id` at the start of every row and (with `segment_ids`) of every segment."""
    out = np.empty_like(targets)
    out[:, 0] = bos_id
    out[:, 1:] = targets[:, :-1]
    if segment_ids is not None:
        prev = np.zeros_like(segment_ids)
        prev[:, 1:] = segment_ids[:, :-1]
        out = np.where(segment_ids == prev, out, np.asarray(bos_id, out.dtype))
    return out


def trim_and_pack_dataset(ds: tf.data.Dataset, feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    """Packs the 1-D features in `feature_lengths`; other features are dropped (as in seqio)."""
    spec = ds.element_spec
    for k in feature_lengths:
        if k not in spec:
            raise ValueError(f"feature {k!r} not in the dataset; it has {sorted(spec)}")
        if not spec[k].shape.is_compatible_with(tf.TensorShape([None])):
            raise ValueError(f"features to pack must be 1-D; {k!r} has shape {spec[k].shape}")
    keys = list(feature_lengths)
    lengths = dict(feature_lengths)
    out_keys = [k + s for k in keys for s in ("", "_positions", "_segment_ids")]

    def np_pack(*arrays):
        packed = pack_group(dict(zip(keys, arrays)), lengths)
        return [packed[k] for k in out_keys]

    def pack(batch):
        args = [tf.cast(batch[k], tf.int32) for k in keys]
        values = tf.numpy_function(np_pack, args, [tf.int32] * len(out_keys), stateful=False)
        out = {}
        for k, v in zip(out_keys, values):
            base = next(b for b in keys if k in (b, b + "_positions", b + "_segment_ids"))
            v.set_shape([None, lengths[base]])
            out[k] = v
        return out

    ds = map_inline(ds, lambda x: {k: x[k][: lengths[k]] for k in keys})
    # Groups of max(lengths) examples, as seqio; padding is cut again in `pack_group`.
    ds = ds.padded_batch(max(lengths.values()), padded_shapes={k: [None] for k in keys})
    return map_inline(ds, pack).unbatch()


@no_autograph
def shift_right(x: tf.Tensor, fill: int = 0) -> tf.Tensor:
    """`[fill, x[0], ..., x[-2]]` along the first axis."""
    return tf.concat([tf.fill([1], tf.cast(fill, x.dtype)), x[:-1]], axis=0)


@no_autograph
def make_autoregressive_inputs(targets: tf.Tensor, sequence_id: tf.Tensor | None = None, bos_id: int = 0) -> tf.Tensor:
    """Decoder inputs: targets shifted right; `bos_id` at the start of every segment."""
    inputs = shift_right(targets, bos_id)
    if sequence_id is not None:
        not_first = tf.cast(tf.equal(sequence_id, shift_right(sequence_id)), targets.dtype)
        inputs = inputs * not_first + (1 - not_first) * tf.cast(bos_id, targets.dtype)
    return inputs
