"""`DeterministicReader`: global batches of a cached task or mixture, a pure function of
(seed, step).

Global row `r` of step `s` is `s * global_batch_size + j`. For a mixture, `r` picks its
task and the cursor `q` in that task's stream statelessly (`mixing`); a task's stream
is epoch `q // bins` and bin `order_epoch(q % bins)` of its packing plan (`plan`); a bin
is a run of records in the task's base order. The order (`shuffle`) is "global" (a seeded
base order, a seeded permutation of the bins per epoch) or "chunks" (the cache order, bins
visited in a seeded chunk-window order: `chunk_order`). Host `h` of `H` owns rows
`j in [h * B / H, (h + 1) * B / H)` and reads only their records. The state is the step.

The reader is a chain of stages: the row index (`row_index.RowIndex`: plan, permutation,
mixing), the record source (`cached_task.CachedTask`), the record stage (`record_stage`: NumPy
or TensorFlow), conversion (the converter's `convert_numpy`, or `record_stage.ConvertStage`),
then batching and prefetch (this class). Those that hold state give it in Grain's manner: the
row index what shapes its rows (`RowIndex.get_state`/`set_state`), batching its position
(`step`); `get_state` is the two together, as checkpoints have always held it. The record
source, the record stage and the conversion hold none (their caches change no batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from cairn import storage
from cairn.datatasks.deterministic import plan as plan_lib
from cairn.datatasks.deterministic.cached_task import DEFAULT_CHUNK_CACHE_BYTES, DEFAULT_OPEN_SHARDS_BYTES, CachedTask
from cairn.datatasks.deterministic.chunk_order import DEFAULT_WINDOW, SHUFFLES
from cairn.datatasks.deterministic.mixing import MixtureSchedule
from cairn.datatasks.deterministic.record_stage import ConvertStage
from cairn.datatasks.deterministic.row_index import RowIndex
from cairn.datatasks.deterministic.store import task_dir
from cairn.datatasks.deterministic.task_stream import TaskStream
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.ragged import Ragged
from cairn.datatasks.registry import Registry, get_mixture_or_task
from cairn.datatasks.task import Task

# Passes computed ahead by default: locally, and for a cache at a URL, where a pass that
# fetches chunks waits a round trip (benchmarks/RESULTS.md, reader_scale_bench.py, 2026-12-07).
PREFETCH = 2
PREFETCH_AT_URL = 8


class DeterministicReader:
    """Iterator over this host's rows of the global batches of a cached task or mixture.

    Args:
      mixture_or_task: a `Task`, a `Mixture`, or a registered name.
      cache_dir: the `output_dir` that `cache_tasks` wrote.
      seed: the seed of the order, the packing plan, the mixture and the post-cache noise.
      global_batch_size: rows per step over all hosts (a multiple of `host_count`).
      sequence_length: the task feature lengths, e.g. `{"inputs": 512, "targets": 128}`.
      feature_converter: converts (and with `pack=True`, packs) each row.
      host_index, host_count: this host's share of every global batch.
      check_source_files: also compare the task's source files (relative names and sizes:
        a listing and a stat per file, no byte read) with those the cache recorded. Opening
        a cache never reads the records or the source bytes (`verify_cache` does).
      check_task: compare each cache with its task's definition (fingerprint). A Grain
        source's worker processes leave it off: the source checked when it was made.
      prefetch: passes (of `steps_per_call` steps) computed ahead in background threads (0:
        none); their cache reads are in flight together. Default: `PREFETCH` (2) on local
        disk, `PREFETCH_AT_URL` (8) for a cache at a URL, where each read waits a round trip
        (with 30 ms added per request, 8 read ~1.4x the rows/s of 2). Changes no batch.
      prefetch_until: no chunk starting at or after this step is computed ahead (a run that
        stops there never reads it; `next` past it still works, computing in the foreground).
      steps_per_call: steps computed together in one pass (amortises the fixed cost of a
        pass, ~5 ms); default: enough for ~1,024 of this host's rows per pass unpacked
        (one example each), ~256 packed (many examples each). Neither changes the batches
        or the state.
      packing: with a packing converter, how records are planned into rows: "greedy"
        (default: seqio's in-order packing, row for row) or "first_fit" (each row filled
        first-fit from the next `packing_window` unplaced records; fuller rows, a
        different order). Either is a pure function of (seed, step): resumable and the
        same global batches for any host count. `get_state` records a first-fit window.
      shuffle: the read order of each task: "global" (a seeded permutation over all records:
        every batch draws from the whole cache) or "chunks" (a seeded order of chunks of
        `shuffle_chunk` consecutive cache records, the rows of each window of `shuffle_window`
        chunks shuffled together: a batch reads about `shuffle_window` chunks). Default: per
        task, "chunks" when its cache is chunked (`group_size > 1`), else "global". Both are
        pure functions of (seed, step), elastic and resumable; `get_state` records "chunks".
      shuffle_chunk: records per order chunk (default: the cache's `group_size`).
      shuffle_window: chunks shuffled together (default 64).
      chunk_cache_bytes: decoded cache chunks kept in memory (an LRU, shared evenly among
        a mixture's tasks): a chunk read for one row serves the other rows in it without
        another read (at a URL, another request). Changes no batch.
      open_shards_bytes: the memory budget of open cache shards (shared evenly among a
        mixture's tasks): at most `budget / cost` ArrayRecord readers stay open per task,
        the least recently used closed first (a shard costs ~256 KB at a URL, ~32 KB locally,
        plus its chunk index). Memory no longer grows with the number of shards. Changes
        no batch.
      store_plan: keep each packed task's plan beside its cache (`<cache>/plans/`,
        `plan_store`): the first reader builds it under a lock, every later one (any host)
        memory-maps it, so start-up no longer passes over the lengths. Where the cache is
        not writable the plan stays in memory (a one-line notice). Changes no batch.
    """

    def __init__(
        self,
        mixture_or_task: Any,
        cache_dir: str,
        seed: int,
        global_batch_size: int,
        sequence_length: Mapping[str, int],
        feature_converter: FeatureConverter,
        host_index: int = 0,
        host_count: int = 1,
        split: str = "train",
        registry: Registry | None = None,
        check_source_files: bool = True,
        check_task: bool = True,
        prefetch: int | None = None,
        prefetch_until: int | None = None,
        steps_per_call: int | None = None,
        packing: str = "greedy",
        packing_window: int = 128,
        shuffle: str | None = None,
        shuffle_chunk: int | None = None,
        shuffle_window: int = DEFAULT_WINDOW,
        chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        open_shards_bytes: int = DEFAULT_OPEN_SHARDS_BYTES,
        store_plan: bool = True,
    ):
        if not (isinstance(host_count, int) and host_count >= 1 and 0 <= host_index < host_count):
            raise DataTasksError(f"host_index must be in [0, host_count), got {host_index} of {host_count}")
        if global_batch_size < 1 or global_batch_size % host_count:
            raise DataTasksError(
                f"global_batch_size {global_batch_size} must be a positive multiple of host_count {host_count}"
            )
        if packing not in plan_lib.PACKING_MODES:
            raise DataTasksError(f"unknown packing {packing!r}; expected one of {plan_lib.PACKING_MODES}")
        if packing != "greedy" and not feature_converter.pack:
            raise DataTasksError(f"packing={packing!r} plans packed rows, but the feature converter has pack=False")
        if not isinstance(packing_window, int) or isinstance(packing_window, bool) or packing_window < 1:
            raise DataTasksError(f"packing_window must be a positive integer, got {packing_window!r}")
        if shuffle is not None and shuffle not in SHUFFLES:
            raise DataTasksError(f"unknown shuffle {shuffle!r}; expected one of {SHUFFLES}")
        for name, value in (("shuffle_chunk", shuffle_chunk), ("shuffle_window", shuffle_window)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise DataTasksError(f"{name} must be a positive integer, got {value!r}")
        if shuffle == "global" and shuffle_chunk is not None:
            raise DataTasksError("shuffle_chunk orders chunks: it needs shuffle='chunks', not 'global'")
        # 0: greedy (what a state without the key means); the window of a first-fit plan.
        self.packing_window = packing_window if packing == "first_fit" else 0
        obj = get_mixture_or_task(mixture_or_task, registry) if isinstance(mixture_or_task, str) else mixture_or_task
        if isinstance(obj, Task):
            tasks, rates = [obj], [1.0]
        else:
            names = sorted(obj.tasks)
            tasks, rates = [obj.tasks[n] for n in names], [obj.rates[n] for n in names]
        self.seed, self.batch = int(seed), int(global_batch_size)
        self.per_host = self.batch // host_count
        self.first_row = host_index * self.per_host
        self.lengths = dict(sequence_length)
        self.converter = feature_converter
        keys = list(feature_converter.TASK_FEATURES)
        caches = [
            CachedTask(
                task_dir(cache_dir, t.name, split),
                t if check_task else None,
                split,
                check_source_files,
                chunk_cache_bytes=int(chunk_cache_bytes) // len(tasks),
                open_shards_bytes=int(open_shards_bytes) // len(tasks),
            )
            for t in tasks
        ]
        # Per task: (shuffle, records per chunk); "chunks" by default on a chunked cache.
        self.orders: list[tuple[str, int]] = []
        for cache in caches:
            group = cache.group_size
            mode = shuffle or ("chunks" if group > 1 else "global")
            self.orders.append((mode, (shuffle_chunk or group) if mode == "chunks" else 1))
        self.streams = [
            TaskStream(
                t,
                cache,
                self.seed,
                feature_converter,
                self.lengths,
                keys,
                packing,
                packing_window,
                mode,
                chunk,
                shuffle_window,
                store_plan,
            )
            for t, cache, (mode, chunk) in zip(tasks, caches, self.orders)
        ]
        self.schedule = MixtureSchedule([t.name for t in tasks], rates, self.seed)
        # The first stage: which planned records make each row (holds no position).
        self.index = RowIndex(
            self.streams,
            self.schedule,
            self.seed,
            self.batch,
            self.per_host,
            self.first_row,
            self.packing_window,
            self.orders,
            shuffle_window,
        )
        self._convert: Any = None
        self._keys = keys
        self._step = 0
        if prefetch is None:
            prefetch = PREFETCH_AT_URL if storage.is_url(cache_dir) else PREFETCH
        self._prefetch = max(0, int(prefetch))
        self._prefetch_until = None if prefetch_until is None else int(prefetch_until)
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future] = {}
        if steps_per_call is None:
            rows = 256 if feature_converter.pack else 1024
            steps_per_call = -(-rows // self.per_host)
        self.steps_per_call = max(1, int(steps_per_call))  # `next` computes this many at once
        self._last: tuple[int, list] | None = None

    # -- state: each stage that holds state gives its own (Grain's manner) ----------
    # The row index: what shapes the rows (seed, batch, packing window, read order). The record
    # source (`CachedTask`), the record stage and the conversion hold none (their caches change
    # no batch). Batching and prefetch: the position, `step` (and the passes computed ahead).
    @property
    def sorted_rows(self) -> bool:
        """Whether each global batch's rows are sorted by first record (a chunk order)."""
        return self.index.sorted_rows

    @sorted_rows.setter
    def sorted_rows(self, value: bool) -> None:
        self.index.sorted_rows = value

    def order_state(self) -> dict[str, int | str]:
        """The read order as `get_state` records it (`RowIndex.order_state`)."""
        return self.index.order_state()

    def get_state(self) -> dict[str, int | str]:
        """`{"step", "seed", "global_batch_size"}`, plus a first-fit `packing_window` and a
        chunk order: the batching stage's position, then the row index's state."""
        return {"step": self._step, **self.index.get_state()}

    def set_state(self, state: Mapping[str, int | str]) -> None:
        """Moves to `state`'s step; a state of other rows is refused first (`RowIndex.set_state`)."""
        self.index.set_state(state)
        step = int(state["step"])
        if step < 0:
            raise DataTasksError(f"state step must be >= 0, got {step}")
        self._step = step
        # A chunk's batches depend only on its index (the rows' state is checked above): the
        # chunks already computed or under way for the new position are kept (a peek at a batch,
        # get_state/next/set_state, computes nothing twice); the others finish in the background
        # and their results are dropped.
        c = step // self.steps_per_call
        for chunk in [i for i in self._ahead if i not in self._wanted(c)]:
            del self._ahead[chunk]
        if self._last is not None and self._last[0] != c:
            self._last = None

    def row_records(self, step: int, count: int = 1) -> list[tuple[str, int, np.ndarray]]:
        """`(task name, epoch, record ids)` of each of this host's rows at steps
        `step .. step + count - 1`, step by step (`RowIndex.row_records`)."""
        return self.index.row_records(step, count)

    def batches_at(self, step: int, count: int) -> list[dict[str, np.ndarray]]:
        """This host's rows of the global batches at `step .. step + count - 1`, computed
        together (one pass); does not move the state."""
        tasks, cursors = self.index.assigned(step, count)
        n_rows = len(tasks)
        parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        for t in np.unique(tasks):
            mine = np.nonzero(tasks == t)[0]
            stream = self.streams[int(t)]
            epochs, ids, sizes = stream.planned(cursors[mine])
            ex = stream.examples(epochs, ids, sizes)
            if not isinstance(next(iter(ex.values())), Ragged):  # converted by a fused stage
                parts.append((mine, ex))
            elif self.converter.converts_numpy:
                parts.append((mine, self.converter.convert_numpy(ex, sizes, self.lengths)))
            else:  # the converter's own TensorFlow conversion, on the same examples and rows
                parts.append((mine, self._convert_stage()(ex, sizes)))
        out = {k: np.empty((n_rows,) + v.shape[1:], v.dtype) for k, v in parts[0][1].items()}
        for where, arrays in parts:
            got = next(iter(arrays.values())).shape[0]
            if got != len(where):
                raise DataTasksError(
                    f"the feature converter made {got} rows from {len(where)} "
                    f"planned rows at steps {step}..{step + count - 1}"
                )
            for k in out:
                out[k][where] = arrays[k]
        return [{k: v[i * self.per_host : (i + 1) * self.per_host] for k, v in out.items()} for i in range(count)]

    def _convert_stage(self) -> Any:
        """The TensorFlow conversion, for converters without a NumPy one (built on first use)."""
        if self._convert is None:
            self._convert = ConvertStage(self.converter, self.lengths, self._keys)
        return self._convert

    def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """`{model feature: (shape, dtype)}` of this host's batches, from the spec alone (the
        batch size over the hosts, the converter's model features and their lengths from the
        sequence lengths; every feature int32): nothing is read. Passthrough features are not
        among them (the reader reads the converter's task features only)."""
        passthrough = set(getattr(self.converter, "_passthrough", ())) - set(self._keys)
        lengths = self.converter.get_model_feature_lengths(self.lengths)
        return {k: ((self.per_host, int(n)), np.dtype(np.int32)) for k, n in lengths.items() if k not in passthrough}

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of the global batch at `step` (does not move the state)."""
        return self.batches_at(step, 1)[0]

    def __iter__(self) -> DeterministicReader:
        return self

    def _wanted(self, c: int) -> range:
        """The chunks computed at chunk `c`: it, and up to `prefetch` ahead that start before
        `prefetch_until`."""
        last = c + self._prefetch
        if self._prefetch_until is not None:
            last = max(c, min(last, (self._prefetch_until - 1) // self.steps_per_call))
        return range(c, last + 1)

    def _chunk(self, c: int) -> list[dict[str, np.ndarray]]:
        return self.batches_at(c * self.steps_per_call, self.steps_per_call)

    def __next__(self) -> dict[str, np.ndarray]:
        step = self._step
        c, i = divmod(step, self.steps_per_call)
        if self._prefetch:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._prefetch, "cairn-det-reader")
            for ahead in self._wanted(c):
                if ahead not in self._ahead:
                    self._ahead[ahead] = self._pool.submit(self._chunk, ahead)
            for old in [k for k in self._ahead if k < c]:
                del self._ahead[old]
            out = self._ahead[c].result()[i]
        else:
            if self._last is None or self._last[0] != c:
                self._last = (c, self._chunk(c))
            out = self._last[1][i]
        self._step = step + 1
        return dict(out)  # a chunk's batches may be handed out again (set_state): a fresh dict

    def close(self) -> None:
        """Stops the prefetch threads and closes the cache files."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._ahead.clear()
        for stream in self.streams:
            stream.cache.close()
