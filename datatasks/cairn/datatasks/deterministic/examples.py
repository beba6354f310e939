"""`NumpyRecordStage`: cached records -> a task's examples, in NumPy (no TensorFlow).

records -> `wire.decode` (the numeric features, for the whole batch at once) -> each
post-cache preprocessor's `numpy_fn` -> the task features cut to their lengths, as
`{feature: Ragged}` in int32. It serves when every post-cache preprocessor has a
`numpy_fn` (`append_eos`, `append_eos_after_trim`, `trim`, and the seeded `random_crop`
and `span_corruption_one_to_one` do); otherwise the reader uses the TensorFlow
`stages.RecordStage`, which gives the same examples.

A seeded preprocessor's `numpy_fn` gets each record's seed as the TensorFlow stage makes
it: the record's key `(epoch key, record id)` folded with the preprocessor's position in
the task (`Task.preprocess`), by `stateless_numpy.fold_in`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from cairn.datatasks import stateless_numpy
from cairn.datatasks.deterministic import wire
from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.preprocessors import as_preprocessor
from cairn.datatasks.ragged import Ragged


class NumpyStep(NamedTuple):
    """One post-cache preprocessor on the NumPy path: its position in the task, its
    `numpy_fn`, and whether it is seeded (gets `seed=` per record)."""

    position: int
    fn: Callable
    seeded: bool


def numpy_fns(task: Any, start: int) -> list[NumpyStep] | None:
    """The NumPy steps of the task's preprocessors from `start` on; None when one lacks a `numpy_fn`."""
    steps = []
    for pos, p in list(enumerate(task.preprocessors))[start:]:
        pre = as_preprocessor(p)
        if pre.numpy_fn is None:
            return None
        steps.append(NumpyStep(pos, pre.numpy_fn, not pre.deterministic))
    return steps


class NumpyRecordStage:
    """Decodes and post-processes one task's records; `__call__` gives `{feature: Ragged}`."""

    def __init__(
        self,
        task: Any,
        specs: Mapping[str, FeatureSpec],
        fns: Sequence[NumpyStep],
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
    ):
        self.task = task
        self.specs = dict(specs)
        self.fns = list(fns)
        self.lengths = dict(sequence_length)
        self.keys = list(keys)
        # Whether `__call__` needs the records' keys (a seeded preprocessor).
        self.seeded = any(step.seeded for step in self.fns)
        # Without post-cache work only the task features are decoded; else every numeric one.
        numeric = sorted(k for k, s in self.specs.items() if s.kind != "bytes")
        self.decode_keys = [k for k in self.keys if k in self.specs] if not self.fns else numeric

    def __call__(self, serialized: Sequence[bytes], keys: np.ndarray | None = None) -> dict[str, Ragged]:
        """The examples of `serialized`; `keys` `[N, 2]` are the records' `(epoch key,
        record id)`, needed when a preprocessor is seeded."""
        missing = [k for k in self.keys if k not in self.specs] if not self.fns else []
        if missing:
            raise DataTasksError(
                f"task {self.task.name!r}: the cache has no feature {missing}; it has {sorted(self.specs)}"
            )
        if self.seeded and (keys is None or np.shape(keys) != (len(serialized), 2)):
            raise DataTasksError(f"task {self.task.name!r}: seeded post-cache preprocessors need [N, 2] record keys")
        x = wire.decode(serialized, self.specs, self.decode_keys)
        for step in self.fns:
            if step.seeded:  # Task.preprocess: stateless_fold_in(record key, position) (int32)
                seed = stateless_numpy.fold_in(np.asarray(keys, np.int64), step.position, np.int32)
                x = dict(step.fn(x, self.lengths, self.task.output_features, seed=seed))
            else:
                x = dict(step.fn(x, self.lengths, self.task.output_features))
        missing = [k for k in self.keys if k not in x]
        if missing:
            raise DataTasksError(
                f"task {self.task.name!r}: no feature {missing} after the post-cache "
                f"preprocessors; they give {sorted(x)}"
            )
        out = {}
        for k in self.keys:
            r = x[k].astype(np.int32)
            out[k] = r.head(self.lengths[k]) if k in self.lengths else r
        return out
