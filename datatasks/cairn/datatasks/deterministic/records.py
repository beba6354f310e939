"""Cached records: one `tf.train.Example` per example, serialized deterministically.

Every feature is stored flat (int64, float or bytes list); `info.json` keeps its dtype
and rank so `parse_batch` gives back the arrays the preprocessors produced (rank <= 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf

_FLOATS = frozenset({"bfloat16", "float16", "float32", "float64", "half", "float", "double"})


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """How one cached feature is stored: its dtype name and rank (0 or 1)."""

    dtype: str
    rank: int

    @property
    def kind(self) -> str:
        """The `tf.train.Feature` list it is stored in: "bytes", "float" or "int64"."""
        if self.dtype == "string":
            return "bytes"
        return "float" if self.dtype in _FLOATS else "int64"


def specs_of(element_spec: Mapping[str, tf.TensorSpec], task_name: str) -> dict[str, FeatureSpec]:
    """The cacheable features of a dataset's element spec (rank 0 or 1 only)."""
    out = {}
    for k, s in sorted(element_spec.items()):
        if not isinstance(s, tf.TensorSpec) or s.shape.rank not in (0, 1):
            raise DataTasksError(
                f"task {task_name!r}: cached feature {k!r} must be a dense "
                f"tensor of rank 0 or 1 after the cacheable preprocessors, "
                f"got {s}"
            )
        out[k] = FeatureSpec(s.dtype.name, int(s.shape.rank))
    return out


def serialize(example: Mapping[str, np.ndarray], specs: Mapping[str, FeatureSpec]) -> bytes:
    """Deterministic bytes for one example (sorted keys, `deterministic=True`)."""
    feature = {}
    for k in sorted(specs):
        v = np.asarray(example[k]).reshape(-1)
        kind = specs[k].kind
        if kind == "bytes":
            feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))
        elif kind == "float":
            feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist()))
        else:
            feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist()))
    ex = tf.train.Example(features=tf.train.Features(feature=feature))
    return ex.SerializeToString(deterministic=True)


def parse(record: bytes, specs: Mapping[str, FeatureSpec], keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One record back to `{name: array}` with the cached dtype and rank."""
    ex = tf.train.Example.FromString(record)
    out = {}
    for k in keys if keys is not None else sorted(specs):
        spec = specs[k]
        f = ex.features.feature[k]
        if spec.kind == "bytes":
            v = np.array(list(f.bytes_list.value), dtype=object)
        elif spec.kind == "float":
            v = np.array(f.float_list.value, dtype=spec.dtype)
        else:
            v = np.array(f.int64_list.value, dtype=spec.dtype)
        out[k] = v.reshape(()) if spec.rank == 0 else v
    return out
