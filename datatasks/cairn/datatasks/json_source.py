"""`JsonLinesDataSource`: JSON Lines files, one object per line, its fields the features."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.datatasks import url_sources
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import FileDataSource, ShardInfo, records_dataset
from cairn.datatasks.stats import DataStats, counted_filter
from cairn.datatasks.tf_data import map_inline


def _json_spec(value: Any) -> tf.TensorSpec:
    if isinstance(value, bool) or isinstance(value, int):
        return tf.TensorSpec([], tf.int64)
    if isinstance(value, float):
        return tf.TensorSpec([], tf.float32)
    if isinstance(value, str):
        return tf.TensorSpec([], tf.string)
    if isinstance(value, list):
        inner = _json_spec(value[0]) if value else tf.TensorSpec([], tf.int64)
        return tf.TensorSpec([None], inner.dtype)
    raise DataTasksError(f"JSON value {value!r} has no tensor type; give feature_spec")


class JsonLinesDataSource(FileDataSource):
    """JSON Lines files: one object per line, its fields become features.

    `feature_spec` maps field -> `tf.TensorSpec` (or a dtype for a scalar); without it,
    the types are inferred from the first line of the first file. Lines that are not
    valid JSON objects with those fields are skipped and counted as `unparsable`.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        feature_spec: Mapping[str, Any] | None = None,
        num_input_examples: Mapping[str, int] | None = None,
    ):
        super().__init__(split_to_filepattern, num_input_examples)
        self._spec = (
            None
            if feature_spec is None
            else {
                k: v if isinstance(v, tf.TensorSpec) else tf.TensorSpec([], tf.dtypes.as_dtype(v))
                for k, v in feature_spec.items()
            }
        )

    def _feature_spec(self, split: str) -> dict[str, tf.TensorSpec]:
        if self._spec is None:
            with url_sources.open_binary(self.list_shards(split)[0]) as f:
                for line in url_sources.iter_lines(f):
                    if line.strip():
                        self._spec = {k: _json_spec(v) for k, v in json.loads(line).items()}
                        break
            if not self._spec:
                raise DataTasksError(f"split {split!r}: empty JSON lines file, give feature_spec")
        return self._spec

    def _read_file(self, path):
        return tf.data.TextLineDataset(path)

    def _read_url_file(self, path):
        return records_dataset(path, "lines")

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        self._split_spec = self._feature_spec(split)
        return super().get_dataset(split, shuffle, seed, shard_info, stats)

    def _postprocess(self, ds, stats):
        spec = self._split_spec
        keys = list(spec)
        empty = [
            np.full(
                [0] * len(spec[k].shape), b"" if spec[k].dtype == tf.string else 0, dtype=spec[k].dtype.as_numpy_dtype
            )
            for k in keys
        ]

        def parse(line: bytes):
            try:
                obj = json.loads(line)
                out = [
                    np.asarray(
                        obj[k]
                        if spec[k].dtype != tf.string
                        else (obj[k].encode("utf-8") if isinstance(obj[k], str) else obj[k]),
                        dtype=spec[k].dtype.as_numpy_dtype,
                    ).reshape([-1] * len(spec[k].shape))
                    for k in keys
                ]
                return [np.bool_(True)] + out
            except Exception:
                return [np.bool_(False)] + empty

        def to_features(line):
            ok, *values = tf.numpy_function(parse, [line], [tf.bool] + [spec[k].dtype for k in keys], stateful=False)
            ok.set_shape([])
            out = {}
            for k, v in zip(keys, values):
                v.set_shape(spec[k].shape)
                out[k] = v
            return ok, out

        ds = map_inline(ds, to_features)
        ds = counted_filter(ds, lambda ok, _: ok, stats, "unparsable")
        return map_inline(ds, lambda _, x: x)
