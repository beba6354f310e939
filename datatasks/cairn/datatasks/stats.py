"""The bad-data policy and the counters that report what it did.

Policy (docs/design.md §5), the same for every task:
  * empty lines (text sources): skipped and counted as `empty_line`;
  * undecodable bytes (invalid UTF-8 in a feature being tokenized): by default encoded
    from the raw bytes by the vocabulary's own rule (SentencePiece: its unknown id;
    ByteVocabulary: the bytes; others: U+FFFD) and counted as `undecodable_replaced`; with
    `undecodable="skip"` the example is dropped and counted as `undecodable_skipped`;
  * over-long examples (a feature longer than its `sequence_length`): by default trimmed
    and counted as `overlong_trimmed`; with `overlong="skip"` dropped and counted as
    `overlong_skipped`;
  * unparsable records (JSON lines): skipped and counted as `unparsable`.
Counting costs a Python call per example, so counts are kept only when a `DataStats` is
passed to `get_dataset` (or `Task.get_dataset`); the policy itself always applies.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from cairn.datatasks.lazy_tf import tf

_UNDECODABLE = ("replace", "skip")
_OVERLONG = ("trim", "skip")


@dataclasses.dataclass(frozen=True)
class BadDataPolicy:
    """What to do with bad examples; see the module docstring."""

    undecodable: str = "replace"
    overlong: str = "trim"

    def __post_init__(self):
        if self.undecodable not in _UNDECODABLE:
            raise ValueError(f"BadDataPolicy.undecodable must be one of {_UNDECODABLE}, got {self.undecodable!r}")
        if self.overlong not in _OVERLONG:
            raise ValueError(f"BadDataPolicy.overlong must be one of {_OVERLONG}, got {self.overlong!r}")


class DataStats:
    """Thread-safe counts of bad examples, keyed by (reason, feature)."""

    def __init__(self):
        self._counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def add(self, reason: str, feature: str = "", n: int = 1) -> None:
        with self._lock:
            self._counts[(reason, feature)] += n

    def count(self, reason: str, feature: str | None = None) -> int:
        with self._lock:
            return sum(v for (r, f), v in self._counts.items() if r == reason and (feature is None or f == feature))

    def as_dict(self) -> dict[str, int]:
        """`{"reason": n}` or `{"reason/feature": n}`, sorted."""
        with self._lock:
            return {(f"{r}/{f}" if f else r): v for (r, f), v in sorted(self._counts.items())}

    def __repr__(self) -> str:
        return f"DataStats({self.as_dict()})"


def counted_filter(
    ds: tf.data.Dataset, keep_fn, stats: DataStats | None, reason: str, feature: str = ""
) -> tf.data.Dataset:
    """`ds.filter(keep_fn)`, counting dropped elements in `stats` when it is given."""
    if stats is None:
        return ds.filter(keep_fn)

    def record(keep: np.ndarray) -> np.ndarray:
        if not keep:
            stats.add(reason, feature)
        return keep

    def predicate(*args):
        keep = keep_fn(*args)
        out = tf.numpy_function(record, [keep], tf.bool, stateful=False)
        out.set_shape([])
        return out

    return ds.filter(predicate)
