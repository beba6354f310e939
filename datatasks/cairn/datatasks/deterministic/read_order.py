"""A task stream's read order: stream position -> (epoch, the records of its row).

Position `q` is epoch `q // bins`, position `q % bins` of that epoch; the epoch's order maps
it to a bin of the packing plan, and the bin's plan positions to records through the base
order. Two orders (`shuffle`):

- "global": a seeded base order over all records (`Permutation(N, (seed, task, "base"))`;
  the plan's bins are runs in it) and a seeded permutation of the bins per epoch. Every row
  may come from anywhere in the cache.
- "chunks": the cache order is the base order (so the plan does not depend on the seed) and
  the bins are visited in chunk-window order (`chunk_order.ChunkOrder`): a run of rows reads
  few chunks of the cache.

`sort_rows` orders the rows of a global batch by (task, first record), which keeps a host's
slice of every batch on the same few chunks of each window (the batch's rows are unchanged).
"""

from __future__ import annotations

import threading

import numpy as np

from cairn.datatasks.deterministic.chunk_order import DEFAULT_WINDOW, ChunkOrder, chunk_bounds
from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.plan import Plan
from cairn.datatasks.deterministic.seeds import derive


def base_order(n: int, seed: int, name: str, shuffle: str) -> Permutation | None:
    """The base order the plan's bins are runs of: seeded ("global"), or the cache's own
    (None: the identity, "chunks")."""
    return Permutation(n, derive(seed, name, "base")) if shuffle == "global" else None


class ReadOrder:
    """The rows of one task's stream (module docstring).

    Args:
      plan: the packing plan over the base order.
      base: `base_order(...)`.
      seed, name: the reader's seed and the task's name (the keys of the orders).
      offsets: `[num_shards + 1]` cumulative record counts ("chunks" only).
      chunk, window: records per chunk and chunks per window ("chunks" only).
    """

    def __init__(
        self,
        plan: Plan,
        base: Permutation | None,
        seed: int,
        name: str,
        offsets: np.ndarray | None = None,
        chunk: int = 1,
        window: int = DEFAULT_WINDOW,
    ):
        self.plan, self.base, self.seed, self.name = plan, base, seed, name
        self.chunks: ChunkOrder | None = None
        if base is None:
            if offsets is None:
                raise ValueError("the chunk order needs the shards' record offsets")
            bounds = chunk_bounds(offsets, chunk)
            self.chunks = ChunkOrder(plan.starts, bounds, derive(seed, name, "chunk_order"), window)
        self._perms: dict[int, Permutation] = {}
        self._lock = threading.Lock()
        # Per thread, the bins of the last positions looked up (sorted): a reader's pass looks
        # up its global batches' rows (to sort them) and then its own share of them, the same
        # positions, in the same thread (the bin of a position is a pure function of it).
        self._last = threading.local()

    def _epoch_perm(self, epoch: int) -> Permutation:
        with self._lock:
            if epoch not in self._perms:
                if len(self._perms) > 8:
                    self._perms.clear()
                self._perms[epoch] = Permutation(self.plan.num_bins, derive(self.seed, self.name, "epoch", epoch))
            return self._perms[epoch]

    def bins(self, epoch: int, ks: np.ndarray) -> np.ndarray:
        """The bins at positions `ks` of epoch `epoch`."""
        if self.chunks is None:
            return self._epoch_perm(epoch)(ks)
        return self.chunks(epoch, ks)

    def planned(self, cursors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(epochs [m], record ids, sizes [m])` of the rows at stream positions `cursors`:
        row `i` holds the next `sizes[i]` of the ids, in order."""
        cursors = np.asarray(cursors, np.int64)
        bins_n = self.plan.num_bins
        epochs, ks = cursors // bins_n, cursors % bins_n
        starts, ends = self._bounds(cursors, epochs, ks)
        sizes = ends - starts
        offsets = np.repeat(starts - np.cumsum(sizes) + sizes, sizes)
        records = self.plan.base_positions(np.arange(int(sizes.sum()), dtype=np.int64) + offsets)
        if self.base is not None:
            records = self.base(records)
        return epochs, records, sizes

    def _bounds(self, cursors: np.ndarray, epochs: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(starts, ends)` plan positions of the bins at `cursors`: this thread's last lookup
        when it holds every one of them, else computed (and kept for the next lookup)."""
        memo = getattr(self._last, "memo", None)
        if memo is not None and cursors.size:
            keys, memo_starts, memo_ends = memo
            at = np.minimum(np.searchsorted(keys, cursors), keys.size - 1)
            if np.array_equal(keys[at], cursors):
                return memo_starts[at], memo_ends[at]
        starts = np.empty_like(cursors)
        ends = np.empty_like(cursors)
        for e in np.unique(epochs):
            where = np.nonzero(epochs == e)[0]
            starts[where], ends[where] = self.plan.bins(self.bins(int(e), ks[where]))
        if cursors.size:
            order = np.argsort(cursors, kind="stable")
            self._last.memo = (cursors[order], starts[order], ends[order])
        return starts, ends


def sort_rows(tasks: np.ndarray, first_records: np.ndarray, batch: int) -> np.ndarray:
    """The permutation that sorts each run of `batch` rows by (task, first record): index
    `i` of the result is the row placed at `i`. A pure function of the global rows, so every
    host count sees the same sorted batches."""
    step = np.arange(tasks.size, dtype=np.int64) // batch
    return np.lexsort((first_records, tasks, step))
