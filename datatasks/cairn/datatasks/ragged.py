"""`Ragged`: a batch of variable-length 1-D arrays as flat values and lengths.

The NumPy data path (the deterministic reader after the cache, the preprocessors'
`numpy_fn`s, the converters' `convert_numpy`) passes examples this way: one array per
feature for a whole batch, never a Python object per example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Rows `values[offsets[i]:offsets[i + 1]]`; `lengths` [N] int64."""

    values: np.ndarray
    lengths: np.ndarray

    @staticmethod
    def from_list(rows: Sequence[np.ndarray], dtype: type = np.int32) -> Ragged:
        lengths = np.array([len(r) for r in rows], np.int64)
        values = np.concatenate([np.asarray(r, dtype).reshape(-1) for r in rows]) if rows else np.zeros(0, dtype)
        return Ragged(values.astype(dtype, copy=False), lengths)

    @property
    def offsets(self) -> np.ndarray:
        """[N + 1] start of each row, then the end."""
        out = np.zeros(self.lengths.size + 1, np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def __len__(self) -> int:
        return int(self.lengths.size)

    def to_list(self) -> list[np.ndarray]:
        return np.split(self.values, self.offsets[1:-1])

    def astype(self, dtype: type) -> Ragged:
        return Ragged(self.values.astype(dtype, copy=False), self.lengths)

    def head(self, n: np.ndarray | int) -> Ragged:
        """Each row cut to its first `n` (a number or one per row) values."""
        new = np.minimum(self.lengths, n)
        if np.array_equal(new, self.lengths):
            return self
        keep = np.arange(self.values.size) - np.repeat(self.offsets[:-1], self.lengths) < np.repeat(new, self.lengths)
        return Ragged(self.values[keep], new)

    def append(self, value: int) -> Ragged:
        """`value` appended to every row."""
        return Ragged(np.insert(self.values, self.offsets[1:], value), self.lengths + 1)

    def take(self, rows: np.ndarray) -> Ragged:
        """The rows `rows`, in that order."""
        rows = np.asarray(rows, np.int64)
        lengths = self.lengths[rows]
        starts = self.offsets[:-1][rows]
        idx = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        return Ragged(self.values[idx], lengths)

    def padded(self, width: int) -> np.ndarray:
        """`[N, width]` rows cut to `width` and padded with 0."""
        r = self.head(width)
        out = np.zeros((r.lengths.size, width), r.values.dtype)
        rows = np.repeat(np.arange(r.lengths.size), r.lengths)
        out[rows, np.arange(r.values.size) - np.repeat(r.offsets[:-1], r.lengths)] = r.values
        return out


def concat(parts: Sequence[Ragged]) -> Ragged:
    """The rows of `parts`, one after another."""
    return Ragged(np.concatenate([p.values for p in parts]), np.concatenate([p.lengths for p in parts]))
