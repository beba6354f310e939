"""Which task fills each row of a mixture: a stateless function of (seed, row) and the rates.

Rows come in blocks of `BLOCK` rows. Each block holds exactly `counts[t]` rows of task `t`
(the rates times `BLOCK`, rounded by largest remainder, ties by task order), laid out in
a seeded order (`Permutation` over the block, keyed by (seed, block)). So task `t`'s cursor
before row `r`, the index of the row in task `t`'s own stream, is
`(r // BLOCK) * counts[t]` plus a count inside the block: O(BLOCK) work, no iteration
over earlier rows. Rates smaller than 1 / BLOCK may round to no rows; the mixture says so.
"""

from __future__ import annotations

import numpy as np

from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.seeds import derive
from cairn.datatasks.errors import DataTasksError

BLOCK = 1 << 14


def block_counts(rates: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Rows per task in a block: `rates * block` rounded by largest remainder."""
    rates = np.asarray(rates, np.float64)
    exact = rates / rates.sum() * block
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: block - counts.sum()]] += 1
    return counts


class MixtureSchedule:
    """Task choice and per-task cursors for global rows of a mixture."""

    def __init__(self, names: list[str], rates: list[float], seed: int, block: int = BLOCK):
        self.names = list(names)
        self.block = block
        self.counts = block_counts(np.asarray(rates), block) if len(names) > 1 else np.array([block])
        zero = [n for n, c, r in zip(names, self.counts, rates) if c == 0 and r > 0]
        if zero:
            raise DataTasksError(
                f"mixture rates of {zero} are below 1/{block} and would give "
                f"them no rows; raise their rates or drop them"
            )
        self._bounds = np.cumsum(self.counts)
        self._seed = seed
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Tasks of every row in block `b`, and per-task counts before each row [block+1, T]."""
        cached = self._cache  # one read: other threads may replace it
        if cached is None or cached[0] != b:
            slots = Permutation(self.block, derive(self._seed, "mixture", b))(np.arange(self.block))
            tasks = np.searchsorted(self._bounds, slots, side="right")
            onehot = np.zeros((self.block + 1, len(self.names)), np.int64)
            onehot[np.arange(1, self.block + 1), tasks] = 1
            cached = (b, tasks, np.cumsum(onehot, 0))
            self._cache = cached
        return cached[1], cached[2]

    def assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(task index, cursor in that task's stream)` for each global row."""
        rows = np.asarray(rows, np.int64)
        if len(self.names) == 1:
            return np.zeros_like(rows), rows
        tasks = np.empty_like(rows)
        cursors = np.empty_like(rows)
        for b in np.unique(rows // self.block):
            where = np.nonzero(rows // self.block == b)[0]
            block_tasks, before = self._block(int(b))
            off = rows[where] - b * self.block
            t = block_tasks[off]
            tasks[where] = t
            cursors[where] = b * self.counts[t] + before[off, t]
        return tasks, cursors
