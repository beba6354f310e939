"""`FeatureConverter`: task features (`inputs`, `targets`) -> model features.

Subclasses follow seqio's converters. On the way in, the task features are checked
(present, integer dtype, rank 1) and trimmed to `task_feature_lengths`; seqio raises on
an over-long feature instead (see the README). With `pack=True` examples are packed with
`packing.trim_and_pack_dataset`, otherwise trimmed and padded.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import tensorflow as tf

from cairn.datatasks import packing
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.inline import map_inline


class FeatureConverter(metaclass=abc.ABCMeta):
    """Base class. `TASK_FEATURES` names the features a task must provide."""

    TASK_FEATURES: Sequence[str] = ()
    MODEL_FEATURES: Sequence[str] = ()
    PACKING_FEATURES: Sequence[str] = ()

    def __init__(self, pack: bool = True, bos_id: int = 0, passthrough_features: Sequence[str] = ()):
        self._pack = bool(pack)
        self._bos_id = bos_id
        self._passthrough = tuple(passthrough_features)

    @property
    def pack(self) -> bool:
        return self._pack

    @property
    def bos_id(self) -> int:
        return self._bos_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pack={self._pack})"

    def _validate(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> None:
        name = type(self).__name__
        missing = [k for k in self.TASK_FEATURES if k not in lengths]
        if missing:
            raise DataTasksError(
                f"{name}: task_feature_lengths is missing {missing}; it needs lengths for {list(self.TASK_FEATURES)}"
            )
        for k, n in lengths.items():
            if not isinstance(n, int) or n < 1:
                raise DataTasksError(f"{name}: length of {k!r} must be an int >= 1, got {n!r}")
        spec = ds.element_spec
        for k in self.TASK_FEATURES:
            if k not in spec:
                raise DataTasksError(f"{name}: the dataset has no feature {k!r}; it has {sorted(spec)}")
            if not spec[k].dtype.is_integer:
                raise DataTasksError(f"{name}: feature {k!r} must be integer ids, got {spec[k].dtype.name}")
            if spec[k].shape.rank not in (None, 1):
                raise DataTasksError(f"{name}: feature {k!r} must have rank 1, got {spec[k].shape.rank}")

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Converts `ds` (task features) to model features."""
        lengths = dict(task_feature_lengths)
        self._validate(ds, lengths)
        keep = list(self.TASK_FEATURES) + list(self._passthrough)
        task_features = set(self.TASK_FEATURES)
        ds = map_inline(ds, lambda x: {k: (tf.cast(x[k], tf.int32) if k in task_features else x[k]) for k in keep})
        return self._convert_features(ds, {k: lengths[k] for k in keep if k in lengths})

    def _pack_or_pad(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> tf.data.Dataset:
        if self._pack:
            return packing.trim_and_pack_dataset(ds, lengths)
        return packing.trim_and_pad_dataset(ds, lengths)

    @abc.abstractmethod
    def _convert_features(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> tf.data.Dataset: ...

    @abc.abstractmethod
    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """The length of every model feature."""


def non_padding(x: tf.Tensor) -> tf.Tensor:
    """1 where `x` is not padding (0), else 0."""
    return tf.cast(tf.not_equal(x, 0), tf.int32)
