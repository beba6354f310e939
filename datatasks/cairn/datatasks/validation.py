"""Checks of a task's examples after preprocessing: presence, dtype, rank and id range.

Static problems (a missing required feature, a wrong dtype or rank in the element spec)
fail when the dataset is built; a value problem (an id outside the vocabulary) fails when
the example is read. Every message names the task, the feature and, for values, the
example index in the stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.tf_data import map_inline, no_autograph


def validate_spec(task_name: str, ds: tf.data.Dataset, output_features: Mapping[str, Any]) -> None:
    """Raises `DataTasksError` when the element spec does not fit `output_features`."""
    spec = ds.element_spec
    if not isinstance(spec, Mapping):
        raise DataTasksError(f"task {task_name!r}: preprocessing must yield a dict of features, got {spec}")
    for k, feat in output_features.items():
        if k not in spec:
            if feat.required:
                raise DataTasksError(
                    f"task {task_name!r}: required feature {k!r} is missing after "
                    f"preprocessing; the examples have {sorted(spec)}"
                )
            continue
        s = spec[k]
        if s.dtype != feat.tf_dtype:
            raise DataTasksError(
                f"task {task_name!r}: feature {k!r} has dtype {s.dtype.name} after "
                f"preprocessing, expected {feat.dtype} (did you forget `tokenize`?)"
            )
        if s.shape.rank is not None and s.shape.rank != feat.rank:
            raise DataTasksError(
                f"task {task_name!r}: feature {k!r} has rank {s.shape.rank} after preprocessing, expected {feat.rank}"
            )


def finalize(
    task_name: str,
    ds: tf.data.Dataset,
    output_features: Mapping[str, Any],
    sequence_length: Mapping[str, int] | None,
    overlong: str = "trim",
    stats: Any = None,
    batch: int = 256,
) -> tf.data.Dataset:
    """Checks ids against the vocabularies and applies the over-long policy.

    Works on batches of `batch` examples (`ragged_batch` ... `unbatch`), so it costs no
    function call per example; the example index in errors counts from the stream start.
    Over-long features are trimmed (`overlong="trim"`) or their examples dropped
    (`"skip"`), and counted in `stats` as `overlong_trimmed/<f>` or `overlong_skipped/<f>`.
    """
    spec = ds.element_spec
    check = [k for k, f in output_features.items() if k in spec and f.tf_dtype.is_integer and spec[k].shape.rank == 1]
    trim = [
        k
        for k in output_features
        if k in spec and spec[k].shape.rank and sequence_length is not None and sequence_length.get(k) is not None
    ]
    unknown_rank = [k for k in output_features if k in spec and spec[k].shape.rank is None]
    if unknown_rank:
        ds = map_inline(
            ds,
            lambda x: {
                k: (tf.ensure_shape(v, [None] * output_features[k].rank) if k in unknown_rank else v)
                for k, v in x.items()
            },
        )
        return finalize(task_name, ds, output_features, sequence_length, overlong, stats, batch)
    if not check and not trim:
        return ds
    reason = "overlong_skipped" if overlong == "skip" else "overlong_trimmed"

    def record(over: np.ndarray) -> np.ndarray:
        # over: [num_trim_features, batch] booleans; returns the rows to keep. The mask
        # comes out of this function so the count cannot be pruned from the graph.
        for k, row in zip(trim, over):
            if row.any():
                stats.add(reason, k, int(row.sum()))
        return np.asarray(~over.any(axis=0)) if overlong == "skip" else np.ones(over.shape[1], bool)

    # Fast path: every feature a scalar or 1-D, so batches can be dense + lengths (unbatching
    # RaggedTensors costs a variant encoding per example in tf.data).
    dense = all(s.shape.rank is not None and s.shape.rank <= 1 for s in spec.values())
    rank1 = [k for k, s in spec.items() if s.shape.rank == 1]

    @no_autograph
    def one_batch(b, x):
        x = dict(x)
        if dense:
            for k in rank1:
                x[k] = tf.RaggedTensor.from_tensor(x[k], lengths=x.pop(f"__len_{k}"))
        asserts = []
        for k in check:
            v = x[k]
            vocab = output_features[k].vocabulary.vocab_size
            rt = v if isinstance(v, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(v)
            ok = tf.logical_and(rt >= 0, rt < vocab)
            row_ok = tf.reduce_all(ok, axis=1)
            first_bad = tf.argmin(tf.cast(row_ok, tf.int32), output_type=tf.int64)
            bad_row = tf.gather(rt, first_bad)
            # String data only: an Assert with other data is built inside a `tf.cond`,
            # which keeps the map from running inline.
            asserts.append(
                tf.debugging.Assert(
                    tf.reduce_all(row_ok),
                    [
                        f"task {task_name}: feature {k} of example",
                        tf.strings.as_string(b * batch + first_bad),
                        f"has an id outside [0, {vocab}):",
                        tf.strings.as_string(bad_row),
                    ],
                    summarize=16,
                )
            )
        keep = None
        overs = []
        for k in trim:
            v = x[k]
            n = sequence_length[k]
            lengths = (
                v.row_lengths()
                if isinstance(v, tf.RaggedTensor)
                else tf.fill([tf.shape(v)[0]], tf.cast(tf.shape(v)[1], tf.int64))
            )
            over = lengths > n
            overs.append(over)
            if overlong == "skip":
                keep = ~over if keep is None else tf.logical_and(keep, ~over)
            else:
                x[k] = v[:, :n]
        if stats is not None and trim:
            keep = tf.numpy_function(record, [tf.stack(overs)], tf.bool, stateful=False)
            keep.set_shape([None])
        if keep is not None:
            idx = tf.where(keep)[:, 0]
            x = {k: tf.gather(v, idx) for k, v in x.items()}
        if dense:
            for k in rank1:
                x[f"__len_{k}"] = x[k].row_lengths()
                x[k] = x[k].to_tensor()
        with tf.control_dependencies(asserts):
            return {
                k: (
                    tf.identity(v)
                    if not isinstance(v, tf.RaggedTensor)
                    else v.with_flat_values(tf.identity(v.flat_values))
                )
                for k, v in x.items()
            }

    if not dense:
        ds = ds.ragged_batch(batch).enumerate()
        ds = map_inline(ds, one_batch)
        return map_inline(ds.unbatch(), lambda x: dict(x))

    @no_autograph
    def add_lengths(x):
        x = dict(x)
        for k in rank1:
            x[f"__len_{k}"] = tf.shape(x[k], out_type=tf.int64)[0]
        return x

    @no_autograph
    def cut(x):
        out = {k: v for k, v in x.items() if not k.startswith("__len_")}
        for k in rank1:
            out[k] = x[k][: x[f"__len_{k}"]]
        return out

    ds = map_inline(ds, add_lengths).padded_batch(batch).enumerate()
    ds = map_inline(ds, one_batch)
    return map_inline(ds.unbatch(), cut)
