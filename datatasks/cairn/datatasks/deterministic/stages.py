"""The TensorFlow record stage of the deterministic reader, one `tf.function` traced once:

* `RecordStage`: serialized records -> parsed -> the task's post-cache preprocessors, each
  record seeded by its own key (from (seed, epoch, record index)) -> trimmed features.

The reader uses it only where the NumPy path (`examples.NumpyRecordStage`) cannot serve:
a post-cache preprocessor without a `numpy_fn`, or records that are not in the cache's
own layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.inline import map_inline, pipeline_options
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors import is_deterministic
from cairn.datatasks.ragged import Ragged


def _description(specs: Mapping[str, FeatureSpec]) -> dict:
    desc = {}
    for k, s in specs.items():
        dt = {"bytes": tf.string, "float": tf.float32, "int64": tf.int64}[s.kind]
        desc[k] = tf.io.FixedLenFeature([], dt) if s.rank == 0 else tf.io.RaggedFeature(dt)
    return desc


def _parse_fn(specs: Mapping[str, FeatureSpec]):
    desc = _description(specs)

    def parse(serialized):
        x = tf.io.parse_single_example(serialized, desc)
        return {k: tf.cast(v, specs[k].dtype) if specs[k].kind != "bytes" else v for k, v in x.items()}

    return parse


class RecordStage:
    """Parses and post-processes one task's records; returns `{feature: [arrays]}`.

    When every post-cache preprocessor is deterministic, they run once over the whole batch
    of records (fast), and with an unpacked `converter` the conversion runs in the same
    pass; otherwise each record runs alone, seeded by its own key.
    """

    def __init__(
        self,
        task: Any,
        specs: Mapping[str, FeatureSpec],
        start: int,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
        converter: FeatureConverter | None = None,
    ):
        self.task_name = task.name
        self.keys = list(keys)
        parse = _parse_fn(specs)
        lengths = dict(sequence_length)
        post = task.preprocessors[start:]
        self.per_record = not all(is_deterministic(p) for p in post)
        # Unpacked and batch-wide, with a converter that has no NumPy conversion: it runs in
        # the same pass (model features out).
        self.fused = (
            converter is not None and not converter.pack and not converter.converts_numpy and not self.per_record
        )

        def select(x):
            missing = [k for k in self.keys if k not in x]
            if missing:
                raise DataTasksError(
                    f"task {task.name!r}: no feature {missing} after the "
                    f"post-cache preprocessors; they give {sorted(x)}"
                )
            return {
                k: tf.cast(x[k], tf.int32)[: lengths[k]] if k in lengths else tf.cast(x[k], tf.int32) for k in self.keys
            }

        def one(i, serialized, key):
            ds = tf.data.Dataset.from_tensors(parse(serialized))
            ds = task.preprocess(ds, lengths, seed=key, start=start)
            return map_inline(ds, lambda x: (i, select(x)))

        def ragged(x):
            return {k: (v.values, v.row_lengths()) for k, v in x.items()}

        desc = _description(specs)
        post_keys = None if post else set(self.keys)

        def parse_all(serialized):
            x = tf.io.parse_example(serialized, {k: v for k, v in desc.items() if post_keys is None or k in post_keys})
            return {k: tf.cast(v, specs[k].dtype) if specs[k].kind != "bytes" else v for k, v in x.items()}

        def dense(e):  # ragged_rank-0 slices -> plain tensors
            return dict(e)

        def single(ds):  # with the options, so nested inline maps stay inline
            return ds.with_options(pipeline_options()).get_single_element()

        @tf.function(
            autograph=False, input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 2], tf.int64)]
        )
        def run(serialized, keys):
            n = tf.shape(serialized)[0]
            n64 = tf.cast(n, tf.int64)
            if self.per_record:
                ds = tf.data.Dataset.from_tensor_slices((tf.range(n64), serialized, keys)).flat_map(one)
                idx, x = single(ds.ragged_batch(n64))
                return idx, ragged(x)
            x = parse_all(serialized)
            if not post:  # nothing after the cache: no per-example work at all
                missing = [k for k in self.keys if k not in x]
                if missing:
                    raise DataTasksError(
                        f"task {task.name!r}: the cache has no feature {missing}; it has {sorted(specs)}"
                    )
                out = {k: tf.cast(x[k], tf.int32) for k in self.keys}
                out = {k: (v[:, : lengths[k]] if k in lengths else v) for k, v in out.items()}
                if not self.fused:
                    return tf.range(n64), ragged(out)
                ds = map_inline(tf.data.Dataset.from_tensor_slices(out), dense)
            else:
                ds = map_inline(tf.data.Dataset.from_tensor_slices(x), dense)
                ds = map_inline(task.preprocess(ds, lengths, seed=None, start=start), select)
            if self.fused:
                out = single(converter(ds, lengths).batch(n64))
                return tf.range(tf.shape(next(iter(out.values())), tf.int64)[0]), out
            x = single(ds.ragged_batch(n64))
            return tf.range(tf.shape(x[self.keys[0]].row_lengths(), tf.int64)[0]), ragged(x)

        self._run = run

    def __call__(self, serialized: list[bytes], keys: np.ndarray) -> dict[str, Any]:
        """`{feature: Ragged}` (one row per record), or `{model feature: [records, L]}` if fused."""
        try:
            idx, out = self._run(tf.constant(serialized, tf.string), tf.constant(keys, tf.int64))
        except (tf.errors.InvalidArgumentError, KeyError) as e:
            raise DataTasksError(
                f"task {self.task_name!r}: reading cached records failed "
                f"(a post-cache preprocessor must keep the features "
                f"{self.keys}): {e}"
            ) from e
        if not np.array_equal(idx.numpy(), np.arange(len(serialized))):
            raise DataTasksError(
                f"task {self.task_name!r}: the post-cache preprocessors must map every record to exactly one example"
            )
        if self.fused:
            return {k: v.numpy() for k, v in out.items()}
        return {k: Ragged(values.numpy(), lengths.numpy().astype(np.int64)) for k, (values, lengths) in out.items()}
