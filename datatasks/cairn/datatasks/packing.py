"""Trimming, padding and packing of token features, with seqio's semantics.

`trim_and_pack_dataset` packs greedily, in order, within groups of `max(lengths)`
consecutive examples (seqio's `padded_batch` + `_pack_with_tf_ops`): an example joins the
current row when every feature still fits, otherwise the row is emitted and a new one
starts; the last row of a group is emitted at the group's end. Each feature of an example
is first cut at its count of non-zero ids, then to the feature's length. `<k>_positions`
restart at 0 for every example and `<k>_segment_ids` count examples from 1 (0 on padding).
The packing loop runs in NumPy inside one `tf.numpy_function` per group (stateful=False, so
iterators stay checkpointable) instead of a `tf.while_loop`: same rows, much faster.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from cairn.datatasks.inline import map_inline

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


def pack_group(batch: Mapping[str, np.ndarray], lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Packs one padded batch `{k: [B, L_k]}` into rows; see the module docstring."""
    keys = list(lengths)
    n = batch[keys[0]].shape[0]
    rows: list[dict[str, list]] = []
    partial: dict[str, list] = {k: [] for k in keys}
    used = {k: 0 for k in keys}

    for i in range(n):
        one = {}
        for k in keys:
            v = batch[k][i]
            one[k] = v[: int(np.count_nonzero(v))][: lengths[k]]
        if any(used[k] + len(one[k]) > lengths[k] for k in keys):
            rows.append(partial)
            partial = {k: [] for k in keys}
            used = {k: 0 for k in keys}
        for k in keys:
            partial[k].append(one[k])
            used[k] += len(one[k])
    if n:
        rows.append(partial)
    out: dict[str, np.ndarray] = {}
    for k in keys:
        tokens = np.zeros((len(rows), lengths[k]), np.int32)
        positions = np.zeros((len(rows), lengths[k]), np.int32)
        for r, row in enumerate(rows):
            at = 0
            for seq in row[k]:
                tokens[r, at : at + len(seq)] = seq
                positions[r, at : at + len(seq)] = np.arange(len(seq), dtype=np.int32)
                at += len(seq)
        starts = (positions == 0).astype(np.int32)
        out[k] = tokens
        out[k + "_positions"] = positions
        out[k + "_segment_ids"] = np.cumsum(starts, axis=1, dtype=np.int32) * (tokens != 0)
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


def shift_right(x: tf.Tensor, fill: int = 0) -> tf.Tensor:
    """`[fill, x[0], ..., x[-2]]` along the first axis."""
    return tf.concat([tf.fill([1], tf.cast(fill, x.dtype)), x[:-1]], axis=0)


def make_autoregressive_inputs(targets: tf.Tensor, sequence_id: tf.Tensor | None = None, bos_id: int = 0) -> tf.Tensor:
    """Decoder inputs: targets shifted right; `bos_id` at the start of every segment."""
    inputs = shift_right(targets, bos_id)
    if sequence_id is not None:
        not_first = tf.cast(tf.equal(sequence_id, shift_right(sequence_id)), targets.dtype)
        inputs = inputs * not_first + (1 - not_first) * tf.cast(bos_id, targets.dtype)
    return inputs
