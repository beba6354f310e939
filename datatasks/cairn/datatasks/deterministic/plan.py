"""Packing plans built from the cached lengths: which records share a row.

A plan splits a seeded base order of a task's records into consecutive *bins*, greedily:
a bin is closed when the next record does not fit in every packed feature, or when it
holds `max(capacity)` records (the feature converter packs groups of that many). Each
epoch then visits the bins in a seeded order (`Permutation` over bins), so the rows of a
task per epoch are a constant, and the row at any position is found in O(1).

`breaks` (sorted record positions, the last `N`) ends a bin at each of them: with the cache's
own order, the ends of its chunks, so that no bin needs two chunks (one fetch each) and the
fetches of a chunk-order read approach one per chunk (issue 37).

`packing="first_fit"` (an option; greedy stays the default for seqio parity) fills each
bin first-fit from a bounded window of upcoming records (`first_fit_bins_chunked`): the
plan then also holds the order of the records it placed (`Plan.order`).

Lengths after the cache: a post-cache preprocessor changes lengths the plan must know.
`output_lengths(fn)` gives its length function, the `Preprocessor.output_lengths` it
declares (or a plain function's `deterministic_lengths` attribute); a packed reader
refuses a post-cache preprocessor without one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cairn.datatasks import preprocessors as pp
from cairn.datatasks.errors import DataTasksError

Lengths = dict  # {feature: int array [N]}


def output_lengths(fn: Callable) -> Callable | None:
    """`f(lengths, sequence_length, output_features) -> lengths` for a preprocessor: its
    `Preprocessor.output_lengths` (arguments bound by a `functools.partial` applied)."""
    return pp.as_preprocessor(fn).output_lengths


def post_cache_lengths(task: Any, lengths: Lengths, sequence_length: Mapping[str, int]) -> Lengths:
    """The lengths after the post-cache preprocessors and the final trim."""
    for fn in task.preprocessors[len(task.cacheable_preprocessors) :]:
        length_fn = output_lengths(fn)
        if length_fn is None:
            raise DataTasksError(
                f"task {task.name!r}: post-cache preprocessor {getattr(fn, '__name__', fn)!r} "
                f"has no length function, so packing cannot be planned from the cached "
                f"lengths; set `fn.deterministic_lengths = f(lengths, sequence_length, "
                f"output_features) -> lengths`, or read with pack=False"
            )
        lengths = dict(length_fn(lengths, sequence_length, task.output_features))
    return pp.trim_lengths(lengths, sequence_length, task.output_features)


PACKING_MODES = ("greedy", "first_fit")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bins over a base order: bin `b` holds plan positions `starts[b]:starts[b+1]`;
    `starts=None` means one record per bin (unpacked; O(1) memory). Plan position `i` is
    base position `order[i]` (`order=None`: the same, as greedy plans keep the base order;
    first-fit plans reorder records within a bounded window)."""

    num_bins: int
    starts: np.ndarray | None = None
    order: np.ndarray | None = None

    def bins(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.starts is None:
            return b, b + 1
        return self.starts[b], self.starts[b + 1]

    def base_positions(self, i: np.ndarray) -> np.ndarray:
        """The base positions of plan positions `i`."""
        return i if self.order is None else self.order[i]


def greedy_bins(lengths: np.ndarray, capacity: np.ndarray, breaks: np.ndarray | None = None) -> Plan:
    """Greedy bins over `lengths` [N, K] (in order) with per-feature `capacity` [K]."""
    lengths = np.asarray(lengths)
    return greedy_bins_chunked(lambda a, b: lengths[a:b], lengths.shape[0], capacity, breaks=breaks)


def _checked_breaks(breaks: np.ndarray | None, n: int) -> np.ndarray | None:
    if breaks is None:
        return None
    breaks = np.asarray(breaks, np.int64).reshape(-1)
    if breaks.size == 0 or breaks[-1] != n or (np.diff(breaks) <= 0).any() or breaks[0] <= 0:
        raise DataTasksError(f"bin breaks must rise strictly to the record count {n}, got {breaks[:4]}..{breaks[-2:]}")
    return breaks


def greedy_bins_chunked(
    units: Callable[[int, int], np.ndarray],
    n: int,
    capacity: np.ndarray,
    chunk: int = 1 << 16,
    breaks: np.ndarray | None = None,
) -> Plan:
    """`greedy_bins` over a stream of `n` records whose lengths `units(a, b)` gives, block
    by block ([b - a, K] for records `a .. b - 1`), so that no [N, K] array is ever built.

    `end[i]`, where a bin starting at record `i` would end, is `min(i + max(capacity), n)`
    cut to what fits in every feature (a `searchsorted` per feature over running sums
    inside the block and the `max(capacity)` records after it), and at least `i + 1`; with
    `breaks`, also cut at the first break after `i`. The bins are the chain 0 -> end[0] ->
    ... -> n (`chain`). O(N log C) time, 4 or 8 bytes
    per record while building (`end`), 8 bytes per bin after.
    """
    capacity = np.asarray(capacity, np.int64).reshape(-1)
    breaks = _checked_breaks(breaks, n)
    cap = int(capacity.max())
    dtype = np.int32 if n + cap < 2**31 - 1 else np.int64
    end = np.empty(n + 1, dtype)
    end[n] = n
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        stop = min(b + cap, n)  # a bin starting before b ends by b - 1 + cap
        u = np.asarray(units(a, stop), np.int64).reshape(stop - a, -1)
        if u.shape[1] != capacity.size:
            raise DataTasksError(f"packing lengths have {u.shape[1]} features, capacity {capacity.size}")
        here = np.minimum(np.arange(a + cap, b + cap, dtype=np.int64), n)
        for j in range(capacity.size):
            cum = np.zeros(stop - a + 1, np.int64)
            np.cumsum(u[:, j], out=cum[1:])
            fit = np.searchsorted(cum, cum[: b - a] + int(capacity[j]), side="right") - 1 + a
            np.minimum(here, fit, out=here)
        if breaks is not None:
            np.minimum(here, breaks[np.searchsorted(breaks, np.arange(a, b), side="right")], out=here)
        np.maximum(here, np.arange(a + 1, b + 1, dtype=np.int64), out=here)
        end[a:b] = here
    starts = chain(end)
    return Plan(starts.size - 1, starts)


def chain(nxt: np.ndarray) -> np.ndarray:
    """`[0, nxt[0], nxt[nxt[0]], ..., n]` for `nxt` of size `n + 1` with `i < nxt[i] <= n`
    (`nxt[n] = n`), without a Python step per element.

    Pointer doubling: `k` squarings give `jump = nxt^(2^k)`; a Python walk under `jump`
    finds every `2^k`-th element of the chain (B / 2^k steps for B bins), and `2^k`
    vectorised steps under `nxt` fill in the elements between them. `k` balances the
    `k` passes over all N records against the walk: 2^k ~ 32 B / N.
    """
    n = nxt.size - 1
    if n <= 0:
        return np.zeros(1, np.int64)
    mean_step = max(1.0, float(nxt[:n].mean(dtype=np.float64)) - (n - 1) / 2)
    k = int(np.clip(np.round(np.log2(32.0 / mean_step)), 0, 8)) if n > 4096 else 0
    jump = nxt
    for _ in range(k):
        jump = jump[jump]
    coarse = [0]
    at = 0
    while at < n:
        at = jump.item(at)
        coarse.append(at)
    if k == 0:
        return np.asarray(coarse, np.int64)
    cur = np.asarray(coarse[:-1], np.int64)
    steps = np.empty((cur.size, 1 << k), np.int64)
    for m in range(1 << k):
        steps[:, m] = cur
        cur = nxt[cur]
    out = steps.reshape(-1)
    return np.append(out[out < n], n)


def first_fit_bins(
    lengths: np.ndarray, capacity: np.ndarray, window: int = 128, breaks: np.ndarray | None = None
) -> Plan:
    """`first_fit_bins_chunked` over `lengths` [N, K]."""
    lengths = np.asarray(lengths)
    return first_fit_bins_chunked(lambda a, b: lengths[a:b], lengths.shape[0], capacity, window, breaks=breaks)


def first_fit_bins_chunked(
    units: Callable[[int, int], np.ndarray],
    n: int,
    capacity: np.ndarray,
    window: int = 128,
    chunk: int = 1 << 16,
    breaks: np.ndarray | None = None,
) -> Plan:
    """Bins filled first-fit from a bounded window of upcoming records (an option; the
    default plan is `greedy_bins_chunked`, seqio's in-order packing).

    Each bin takes, in base order, the not-yet-placed records that fit in every feature
    (at least one: the first, so no record waits long), as greedy does; then, of the next
    `window` not-yet-placed records from the first that did not fit, each one that still
    fits, in order, up to `max(capacity)` records. `window=1` is greedy. A bin keeps its
    records in base order. The plan is a pure function of the lengths (the same on every
    host and at every step); `units(a, b)` gives the [b - a, K] lengths of records
    `a .. b - 1`, read block by block. About 4 us per record (a few NumPy calls per bin).
    With `breaks`, the candidates never reach past the next break after the first unplaced
    record, so a bin's records lie between two breaks.
    """
    if not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1:
        raise DataTasksError(f"packing window must be a positive integer, got {window!r}")
    capacity = np.asarray(capacity, np.int64).reshape(-1)
    breaks = _checked_breaks(breaks, n)
    most = int(capacity.max()) if capacity.size else 1
    order = np.empty(n, np.int32 if n < 2**31 - 1 else np.int64)
    starts = [0]
    # The next `most + window` records not yet placed, in order, refilled from a block.
    buf_pos = np.zeros(0, np.int64)
    buf_len = np.zeros((0, capacity.size), np.int64)
    block = np.zeros((0, capacity.size), np.int64)
    block_start = block_at = 0  # the block holds records block_start.., next is block_at
    placed = 0
    while placed < n:
        need = most + window - buf_pos.size
        limit = n
        if breaks is not None:  # no candidate past the break after the first unplaced record
            first = int(buf_pos[0]) if buf_pos.size else block_at
            limit = int(breaks[np.searchsorted(breaks, first, side="right")])
        while need > 0 and block_at < limit:
            if block_at == block_start + block.shape[0]:
                stop = min(block_at + chunk, n)
                block = np.asarray(units(block_at, stop), np.int64).reshape(stop - block_at, -1)
                if block.shape[1] != capacity.size:
                    raise DataTasksError(f"packing lengths have {block.shape[1]} features, capacity {capacity.size}")
                block_start = block_at
            take = min(need, block_start + block.shape[0] - block_at, limit - block_at)
            buf_pos = np.concatenate([buf_pos, np.arange(block_at, block_at + take)])
            buf_len = np.concatenate([buf_len, block[block_at - block_start :][:take]])
            block_at += take
            need -= take
        # The in-order prefix that fits (greedy's bin), at least one record ...
        head = buf_len[:most]
        fits = (np.cumsum(head, 0) <= capacity).all(1)
        p = max(int(fits.size if fits.all() else np.argmin(fits)), 1)
        taken = list(range(p))
        room = capacity - head[:p].sum(0)
        # ... then, of the `window` records from the first misfit on, each that still fits.
        stop = min(p + window, buf_pos.size)
        at = p
        while len(taken) < most and at < stop:
            later = np.flatnonzero((buf_len[at:stop] <= room).all(1))
            if later.size == 0:
                break
            at += int(later[0])
            taken.append(at)
            room = room - buf_len[at]
            at += 1
        order[placed : placed + len(taken)] = buf_pos[taken]
        placed += len(taken)
        starts.append(placed)
        if len(taken) == p:  # no lookahead record taken: drop the prefix (cheap)
            buf_pos, buf_len = buf_pos[p:], buf_len[p:]
        else:
            keep = np.ones(buf_pos.size, bool)
            keep[taken] = False
            buf_pos, buf_len = buf_pos[keep], buf_len[keep]
    return Plan(len(starts) - 1, np.asarray(starts, np.int64), order)


def packed_bins(
    mode: str,
    units: Callable[[int, int], np.ndarray],
    n: int,
    capacity: np.ndarray,
    window: int = 128,
    breaks: np.ndarray | None = None,
) -> Plan:
    """The plan of packing `mode`: "greedy" (default, seqio's rows) or "first_fit"; with
    `breaks`, no bin spans one of them."""
    if mode == "greedy":
        return greedy_bins_chunked(units, n, capacity, breaks=breaks)
    if mode == "first_fit":
        return first_fit_bins_chunked(units, n, capacity, window, breaks=breaks)
    raise DataTasksError(f"unknown packing mode {mode!r}; expected one of {PACKING_MODES}")
