"""A read order with locality: a seeded shuffle of chunks, bins shuffled within windows of chunks.

The records are in cache order (shuffled within each shard once, when the cache is written),
cut into *chunks* of `chunk` records per shard (chunk `k` of shard `s` is its local records
`[k * chunk, min((k + 1) * chunk, n_s))`; chunks are numbered globally, shard 0's first). A bin
of the packing plan belongs to the chunk of its first record. Epoch `e`:

1. the chunks are visited in a seeded order (`Permutation(C, (key, e))`);
2. consecutive runs of `window` chunks in that order form *windows*;
3. a window's bins are visited in a seeded order (`Permutation(bins in it, (key, e, w))`).

So position `k` of epoch `e` is found by a `searchsorted` over the windows' bin counts
(prefix sums computed once per epoch, O(C) work, C / window integers kept), then `window`
Feistel evaluations for the window's chunks: never O(records) per seek. Every bin is visited
exactly once per epoch, and a run of `window * chunk` records' worth of positions reads about
`window` chunks.
"""

from __future__ import annotations

import threading

import numpy as np

from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.seeds import derive
from cairn.datatasks.errors import DataTasksError

SHUFFLES = ("global", "chunks")
DEFAULT_WINDOW = 64  # chunks per window (datatasks/README.md, "What shuffled means")
_EPOCHS_KEPT = 8


def chunk_bounds(offsets: np.ndarray, chunk: int) -> np.ndarray:
    """`[C + 1]` first record of each chunk of `chunk` records per shard (then the total), for
    shards of cumulative record counts `offsets` `[num_shards + 1]`."""
    offsets = np.asarray(offsets, np.int64)
    sizes = np.diff(offsets)
    per_shard = -(-sizes // chunk)  # empty shards have no chunk
    first = np.repeat(offsets[:-1], per_shard)
    local = np.arange(int(per_shard.sum()), dtype=np.int64) - np.repeat(np.cumsum(per_shard) - per_shard, per_shard)
    return np.append(first + local * chunk, offsets[-1])


class ChunkOrder:
    """The bins of each epoch in chunk-window order (module docstring).

    Args:
      bin_starts: `[num_bins + 1]` first plan position of each bin, then the total (a plan's
        `starts`; `None` for one record per bin).
      bounds: `[C + 1]` first plan position of each chunk, then the total (`chunk_bounds`).
      key: the order's seed (e.g. `derive(seed, task, "chunks")`).
      window: chunks per window.
    """

    def __init__(self, bin_starts: np.ndarray | None, bounds: np.ndarray, key: int, window: int):
        if not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1:
            raise DataTasksError(f"shuffle_window must be a positive integer, got {window!r}")
        bounds = np.asarray(bounds, np.int64)
        if bin_starts is None:
            first_bin = bounds
        else:  # the bins whose first record lies in each chunk: [first_bin[c], first_bin[c + 1])
            first_bin = np.searchsorted(np.asarray(bin_starts)[:-1], bounds, side="left").astype(np.int64)
        self.first_bin = first_bin
        self.counts = np.diff(first_bin)
        self.num_chunks = int(self.counts.size)
        self.num_bins = int(first_bin[-1])
        self.key, self.window = int(key), int(window)
        self._epochs: dict[int, tuple[Permutation, np.ndarray]] = {}
        self._lock = threading.Lock()

    def _epoch(self, epoch: int) -> tuple[Permutation, np.ndarray]:
        """The chunk order of `epoch` and its windows' bin prefix sums `[windows + 1]` (cached)."""
        with self._lock:
            if epoch not in self._epochs:
                if len(self._epochs) >= _EPOCHS_KEPT:
                    self._epochs.clear()
                chunks = Permutation(self.num_chunks, derive(self.key, "chunks", epoch))
                counts = self.counts[chunks.range(0, self.num_chunks)]
                per_window = np.add.reduceat(counts, np.arange(0, self.num_chunks, self.window))
                prefix = np.zeros(per_window.size + 1, np.int64)
                np.cumsum(per_window, out=prefix[1:])
                self._epochs[epoch] = (chunks, prefix)
            return self._epochs[epoch]

    def chunks_of_window(self, epoch: int, window: int) -> np.ndarray:
        """The chunks of window `window` of `epoch`, in visiting order."""
        chunks, _ = self._epoch(epoch)
        return chunks.range(window * self.window, min((window + 1) * self.window, self.num_chunks))

    def __call__(self, epoch: int, ks: np.ndarray) -> np.ndarray:
        """The bins at positions `ks` (each in `[0, num_bins)`) of epoch `epoch`."""
        ks = np.asarray(ks, np.int64)
        if ks.size and (ks.min() < 0 or ks.max() >= self.num_bins):
            raise IndexError(f"ChunkOrder over {self.num_bins} bins: position out of range")
        _, prefix = self._epoch(epoch)
        windows = np.searchsorted(prefix, ks, side="right") - 1  # empty windows are skipped
        out = np.empty_like(ks)
        for w in np.unique(windows).tolist():
            where = np.nonzero(windows == w)[0]
            chunks = self.chunks_of_window(epoch, w)
            cum = np.zeros(chunks.size + 1, np.int64)
            np.cumsum(self.counts[chunks], out=cum[1:])
            j = Permutation(int(cum[-1]), derive(self.key, "window", epoch, w))(ks[where] - prefix[w])
            at = np.searchsorted(cum, j, side="right") - 1
            out[where] = self.first_bin[chunks[at]] + j - cum[at]
        return out
