"""`NumpyRecordStage`: cached records -> a task's examples, in NumPy (no TensorFlow).

records -> `wire.decode` (the numeric features, for the whole batch at once) -> each
post-cache preprocessor's `numpy_fn` -> the task features cut to their lengths, as
`{feature: Ragged}` in int32. It serves when every post-cache preprocessor is
deterministic and has a `numpy_fn` (`append_eos`, `append_eos_after_trim`, `trim` do);
otherwise the reader uses the TensorFlow `stages.RecordStage`, which gives the same
examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.datatasks.deterministic import wire
from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.preprocessors import as_preprocessor
from cairn.datatasks.ragged import Ragged


def numpy_fns(task: Any, start: int) -> list | None:
    """The `numpy_fn`s of the task's preprocessors from `start` on; None when one lacks it."""
    fns = []
    for p in task.preprocessors[start:]:
        pre = as_preprocessor(p)
        if pre.numpy_fn is None or not pre.deterministic:
            return None
        fns.append(pre.numpy_fn)
    return fns


class NumpyRecordStage:
    """Decodes and post-processes one task's records; `__call__` gives `{feature: Ragged}`."""

    def __init__(
        self,
        task: Any,
        specs: Mapping[str, FeatureSpec],
        fns: Sequence,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
    ):
        self.task = task
        self.specs = dict(specs)
        self.fns = list(fns)
        self.lengths = dict(sequence_length)
        self.keys = list(keys)
        # Without post-cache work only the task features are decoded; else every numeric one.
        numeric = sorted(k for k, s in self.specs.items() if s.kind != "bytes")
        self.decode_keys = [k for k in self.keys if k in self.specs] if not self.fns else numeric

    def __call__(self, serialized: Sequence[bytes]) -> dict[str, Ragged]:
        missing = [k for k in self.keys if k not in self.specs] if not self.fns else []
        if missing:
            raise DataTasksError(
                f"task {self.task.name!r}: the cache has no feature {missing}; it has {sorted(self.specs)}"
            )
        x = wire.decode(serialized, self.specs, self.decode_keys)
        for fn in self.fns:
            x = dict(fn(x, self.lengths, self.task.output_features))
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
