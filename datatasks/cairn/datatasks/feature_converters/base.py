"""`FeatureConverter`: task features (`inputs`, `targets`) -> model features.

Subclasses follow seqio's converters. On the way in, the task features are checked
(present, integer dtype, rank 1) and trimmed to `task_feature_lengths`; with
`apply_length_check=True` an over-long feature is an error instead, as in seqio (whose
default that is; see the README). With `pack=True` examples are packed with
`packing.trim_and_pack_dataset`, otherwise trimmed and padded.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks import packing
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.ragged import Ragged
from cairn.datatasks.tf_data import map_inline, no_autograph


class FeatureConverter(metaclass=abc.ABCMeta):
    """Base class. `TASK_FEATURES` names the features a task must provide."""

    TASK_FEATURES: Sequence[str] = ()
    MODEL_FEATURES: Sequence[str] = ()
    PACKING_FEATURES: Sequence[str] = ()

    def __init__(
        self,
        pack: bool = True,
        bos_id: int = 0,
        passthrough_features: Sequence[str] = (),
        *,
        apply_length_check: bool = False,
    ):
        self._pack = bool(pack)
        self._bos_id = bos_id
        self._passthrough = tuple(passthrough_features)
        self._apply_length_check = bool(apply_length_check)

    @property
    def pack(self) -> bool:
        return self._pack

    @property
    def bos_id(self) -> int:
        return self._bos_id

    @property
    def apply_length_check(self) -> bool:
        """Whether a task feature longer than its length is an error (else it is trimmed)."""
        return self._apply_length_check

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
        keep_lengths = {k: lengths[k] for k in keep if k in lengths}
        if self._apply_length_check:
            ds = self._check_lengths(ds, keep_lengths)
        return self._convert_features(ds, keep_lengths)

    def _check_lengths(self, ds: tf.data.Dataset, lengths: Mapping[str, int], exact: bool = False) -> tf.data.Dataset:
        """`ds` failing (`tf.errors.InvalidArgumentError` naming the feature in backquotes:
        TensorFlow escapes quotes in assertion messages) on an example
        with a feature longer than (`exact`: not equal to) its length in `lengths`."""
        name, spec = type(self).__name__, ds.element_spec
        checked = {k: n for k, n in lengths.items() if k in spec and spec[k].shape.rank == 1}
        op, words = (
            (tf.debugging.assert_equal, "does not have")
            if exact
            else (tf.debugging.assert_less_equal, "is longer than")
        )

        def check(x):
            asserts = [
                op(tf.shape(x[k])[0], n, message=f"{name}: feature `{k}` {words} its length {n} (apply_length_check)")
                for k, n in checked.items()
            ]
            with tf.control_dependencies(asserts):
                return {k: tf.identity(v) if k in checked else v for k, v in x.items()}

        return map_inline(ds, check)

    def _pack_or_pad(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> tf.data.Dataset:
        if self._pack:
            return packing.trim_and_pack_dataset(ds, lengths)
        return packing.trim_and_pad_dataset(ds, lengths)

    @abc.abstractmethod
    def _convert_features(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> tf.data.Dataset: ...

    # -- the NumPy path (the deterministic reader) -------------------------------------
    @property
    def converts_numpy(self) -> bool:
        """Whether `convert_numpy` gives this converter's output: the class itself (not a
        subclass, which may change the TensorFlow conversion) defines it, and no
        passthrough features are asked for."""
        return "_convert_numpy" in type(self).__dict__ and not self._passthrough

    def convert_numpy(
        self, features: Mapping[str, Ragged], row_sizes: np.ndarray, task_feature_lengths: Mapping[str, int]
    ) -> dict[str, np.ndarray]:
        """The model features of rows of examples, in NumPy: row `r` holds the next
        `row_sizes[r]` examples of `features` (`{task feature: Ragged}`, trimmed to the task
        lengths; one example per row unpacked). Equal to `__call__` on those examples when
        packing puts exactly those examples in each row (what a packing plan guarantees)."""
        if not self.converts_numpy:
            raise DataTasksError(f"{type(self).__name__} has no NumPy conversion")
        sizes = np.asarray(row_sizes, np.int64)
        if not self._pack and (sizes != 1).any():
            raise DataTasksError(f"{type(self).__name__}(pack=False) converts one example per row")
        lengths = {k: task_feature_lengths[k] for k in self.TASK_FEATURES}
        if self._apply_length_check:
            for k, n in lengths.items():
                if (features[k].lengths > n).any():
                    raise DataTasksError(
                        f"{type(self).__name__}: feature {k!r} is longer than its length {n} (apply_length_check)"
                    )
        return self._convert_numpy({k: features[k].astype(np.int32) for k in self.TASK_FEATURES}, sizes, lengths)

    def _convert_numpy(
        self, features: Mapping[str, Ragged], row_sizes: np.ndarray, lengths: Mapping[str, int]
    ) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _pack_or_pad_numpy(
        self, features: Mapping[str, Ragged], row_sizes: np.ndarray, lengths: Mapping[str, int]
    ) -> dict[str, np.ndarray]:
        """`_pack_or_pad` in NumPy: packed rows (`packing.pack_rows`) or trimmed, padded ones."""
        if self._pack:
            return packing.pack_rows(features, row_sizes, lengths)
        return {k: features[k].padded(n) for k, n in lengths.items()}

    def packing_units(
        self, lengths: Mapping[str, np.ndarray], sequence_length: Mapping[str, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """`([N, K] units, [K] capacities)`: what each example takes of a packed row, per
        packed sequence, from the task features' lengths (how packing plans are made)."""
        raise DataTasksError(
            f"packing is planned for EncDec, LM and PrefixLM converters; got "
            f"{type(self).__name__} (read it with pack=False)"
        )

    @staticmethod
    def _units_of(lengths: Mapping[str, np.ndarray], k: str, sequence_length: Mapping[str, int]) -> np.ndarray:
        if k not in lengths:
            raise DataTasksError(
                f"the converter packs feature {k!r}, which the task does not produce; it has {sorted(lengths)}"
            )
        return np.minimum(np.asarray(lengths[k], np.int64), sequence_length[k])

    @abc.abstractmethod
    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """The length of every model feature."""

    def _passthrough_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """The lengths of the passthrough features given a length (seqio's model lengths list them)."""
        return {k: task_feature_lengths[k] for k in self._passthrough if k in task_feature_lengths}


@no_autograph
def non_padding(x: tf.Tensor) -> tf.Tensor:
    """1 where `x` is not padding (0), else 0."""
    return tf.cast(tf.not_equal(x, 0), tf.int32)


def non_padding_numpy(x: np.ndarray) -> np.ndarray:
    """`non_padding` in NumPy."""
    return (x != 0).astype(np.int32)
