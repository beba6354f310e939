"""`TaskStream`: one cached task's side of `DeterministicReader` (its cache, packing plan,
read order (`read_order`: "global" or "chunks"), and the post-cache stages that turn planned
rows into examples)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn.datatasks.deterministic import plan as plan_lib
from cairn.datatasks.deterministic import plan_store
from cairn.datatasks.deterministic.cached_task import CachedTask
from cairn.datatasks.deterministic.chunk_order import DEFAULT_WINDOW, chunk_bounds
from cairn.datatasks.deterministic.read_order import ReadOrder, base_order
from cairn.datatasks.deterministic.record_stage import NumpyRecordStage, RecordStage, WireFormatError, numpy_fns
from cairn.datatasks.deterministic.seeds import record_key
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.task import Task


class TaskStream:
    """One task's cache, plan and stages."""

    def __init__(
        self,
        task: Task,
        cache: CachedTask,
        seed: int,
        converter: FeatureConverter,
        lengths: Mapping[str, int],
        keys: list[str],
        packing: str = "greedy",
        packing_window: int = 128,
        shuffle: str = "global",
        shuffle_chunk: int = 1,
        shuffle_window: int = DEFAULT_WINDOW,
        store_plan: bool = True,
    ):
        self.task, self.cache, self.seed = task, cache, seed
        n = cache.num_records
        self.base = base_order(n, seed, task.name, shuffle)
        self.sequence_length = dict(lengths)
        self.check_lengths = converter.pack
        if converter.pack:
            # Block by block over the base order: never an [N, K] array or the whole order.
            def units(a: int, b: int) -> np.ndarray:
                ids = np.arange(a, b, dtype=np.int64) if self.base is None else self.base.range(a, b)
                return converter.packing_units(self.expected_lengths(ids), lengths)[0]

            _, capacity = converter.packing_units(self.expected_lengths(np.zeros(1, np.int64)), lengths)
            # In the cache's own order, no bin runs into the next chunk of the cache: a bin is
            # then read with one chunk fetch (issue 37), at the cost of a shorter last bin per chunk.
            group = cache.group_size if self.base is None and cache.group_size > 1 else 0
            breaks = chunk_bounds(cache.offsets, group)[1:] if group else None

            def build() -> plan_lib.Plan:
                plan = plan_lib.packed_bins(packing, units, n, capacity, packing_window, breaks)
                cache.remap_lengths()
                return plan

            if store_plan:  # built once beside the cache, memory-mapped by every later start
                base: dict[str, Any] = (
                    {"order": "cache"} if self.base is None else {"order": "global", "seed": int(seed)}
                )
                if group:
                    base["bins_within_chunks_of"] = group
                split = str(cache.info.get("split", "train"))
                key = plan_store.plan_key(
                    cache, task, split, converter, lengths, capacity, packing, packing_window, base
                )
                self.plan, self.plan_source = plan_store.load_or_build(cache, key, build, {"task": task.name, **base})
                self.plan_key: str | None = key
            else:
                self.plan, self.plan_source, self.plan_key = build(), "memory", None
        else:
            self.plan, self.plan_source, self.plan_key = plan_lib.Plan(n), "unpacked", None
        self.order = ReadOrder(self.plan, self.base, seed, task.name, cache.offsets, shuffle_chunk, shuffle_window)
        self._lock = threading.Lock()
        self._converter, self._keys = converter, keys
        start = len(task.cacheable_preprocessors)
        fns = numpy_fns(task, start)
        # The NumPy path when the post-cache preprocessors allow it; TensorFlow otherwise.
        self.numpy_stage = NumpyRecordStage(task, cache.specs, fns, lengths, keys) if fns is not None else None
        self._tf_stage: Any = None

    @property
    def tf_stage(self) -> Any:
        """The TensorFlow record stage (built, and TensorFlow imported, on first use)."""
        with self._lock:
            if self._tf_stage is None:
                start = len(self.task.cacheable_preprocessors)
                self._tf_stage = RecordStage(
                    self.task, self.cache.specs, start, self.sequence_length, self._keys, self._converter
                )
            return self._tf_stage

    def expected_lengths(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The lengths of records `ids` after the post-cache preprocessors and the trim,
        from the cached lengths (memory-mapped: only these rows are read). Length functions
        work record by record, so any subset gives the same values as the whole."""
        rows = self.cache.lengths_of(ids)
        stored = {k: rows[:, j] for j, k in enumerate(self.cache.length_features)}
        return plan_lib.post_cache_lengths(self.task, stored, self.sequence_length)

    def planned(self, cursors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(epochs [m], record ids, sizes [m])` of the task's rows at stream positions
        `cursors`: row `i` holds the next `sizes[i]` of the ids, in order."""
        return self.order.planned(cursors)

    def rows(self, cursors: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """`(epoch, record ids)` of the task's rows at stream positions `cursors`."""
        epochs, records, sizes = self.planned(cursors)
        split = np.split(records, np.cumsum(sizes)[:-1])
        return [(int(e), r) for e, r in zip(epochs.tolist(), split)]

    def record_keys(self, epochs: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """`[n, 2]` int64 keys `(epoch key, record id)` of the planned rows' records: each
        record's own seed, from (seed, epoch, record index), for both record stages."""
        unique, which = np.unique(epochs, return_inverse=True)
        epoch_keys = np.array([record_key(self.seed, self.task.name, int(e), 0)[0] for e in unique], np.int64)
        return np.stack([np.repeat(epoch_keys[which], sizes), np.asarray(ids, np.int64)], 1)

    def examples(self, epochs: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> dict[str, Any]:
        """The post-processed, trimmed examples of the planned rows `(epochs, ids, sizes)`,
        flattened in row order (`{feature: Ragged}`), or with a fused TensorFlow stage the
        converted rows (`{model feature: [rows, L]}`)."""
        records = self.cache.read(ids)
        out: dict[str, Any] | None = None
        if self.numpy_stage is not None:
            try:
                keys = self.record_keys(epochs, ids, sizes) if self.numpy_stage.seeded else None
                out = self.numpy_stage(records, keys)
            except WireFormatError:
                self.numpy_stage = None  # records of another layout: TensorFlow parses them
        if out is None:
            stage = self.tf_stage
            if stage.per_record:
                out = stage(records, self.record_keys(epochs, ids, sizes))
            else:
                out = stage(records, np.zeros((len(ids), 2), np.int64))
            if stage.fused:
                return out
        if self.check_lengths:
            expected = self.expected_lengths(ids)
            for k, vals in out.items():
                if k in expected:
                    got = vals.lengths
                    want = np.asarray(expected[k])
                    if not np.array_equal(got, want):
                        raise DataTasksError(
                            f"task {self.task.name!r}: feature {k!r} has lengths {got[:8]} "
                            f"after the post-cache preprocessors, but their length functions "
                            f"planned {want[:8]}; fix the `deterministic_lengths` function"
                        )
        return out
