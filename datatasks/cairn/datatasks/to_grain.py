"""A Cairn deterministic pipeline as a Grain source: `as_grain_source`, `as_grain_dataset`.

Element `i` of the source is the `i`-th element of this host's stream of the
`DeterministicReader` built from the same arguments:

* `element="row"` (default): row `i % R` of this host's batch at step `i // R`, where
  `R = global_batch_size / shard_count` (one packed or unpacked model row, `{feature: [L]}`);
* `element="batch"`: this host's batch at step `i` (`{feature: [R, L]}`).

So Grain reading the source in order (`IndexSampler(..., shuffle=False)`, or a `MapDataset`
without `shuffle`) and batching `R` rows yields the reader's batches for the same seed and
step, and Grain's checkpointable iterator (its state is the next index) resumes them.

Hosts: the source is one host's share, chosen by a Grain `ShardOptions` (e.g.
`ShardByJaxProcess()`) given to the *source*. Grain's sampler splits records into contiguous
blocks, while a Cairn host owns a slice of every global batch; a host's source therefore
holds exactly that host's rows, and the sampler is left unsharded (`NoSharding()`).

Nothing here imports Grain except `as_grain_dataset` (the `grain` extra, imported lazily):
the source is the duck-typed `RandomAccessDataSource` protocol (`__len__`, `__getitem__`).
The source pickles (with cloudpickle, as Grain sends it to its worker processes) without its
reader, which each process opens again on first use; a task or mixture given by name is
looked up once, when the source is made, and travels as the object.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from cairn.datatasks.deterministic.reader import DeterministicReader
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.registry import get_mixture_or_task

ELEMENTS = ("row", "batch")
# DeterministicReader arguments a source passes through; host_index/host_count come from
# `shard_options`, and the source reads on demand (no prefetch of its own: Grain prefetches).
READER_OPTIONS = (
    "split",
    "registry",
    "check_source_files",
    "steps_per_call",
    "packing",
    "packing_window",
    "shuffle",
    "shuffle_chunk",
    "shuffle_window",
)
_KEEP_CHUNKS = 4  # passes of steps kept for the rows that Grain's reader threads ask for next


def import_grain() -> Any:
    """The `grain` package, or a one-line `DataTasksError` saying how to install it."""
    try:
        import grain
    except ImportError as e:
        raise DataTasksError(
            f"Grain interop needs the `grain` package (pip install 'cairn-datatasks[grain]'): {e}"
        ) from e
    return grain


def shard_of(shard_options: Any) -> tuple[int, int]:
    """`(index, count)` of a Grain `ShardOptions` (None: one host)."""
    if shard_options is None:
        return 0, 1
    index, count = getattr(shard_options, "shard_index", None), getattr(shard_options, "shard_count", None)
    if isinstance(index, int) and isinstance(count, int) and not isinstance(index, bool) and 0 <= index < count:
        return index, count
    raise DataTasksError(
        f"shard_options must be a grain ShardOptions with 0 <= shard_index < shard_count, got {shard_options!r}"
    )


class DeterministicGrainSource:
    """Random access (`len`, `[i]`) to this host's rows or batches of a deterministic pipeline.

    Args: those of `DeterministicReader` (`mixture_or_task`, `cache_dir`, `seed`,
    `global_batch_size`, `sequence_length`, `feature_converter` and the `READER_OPTIONS`), and
      num_steps: the steps the source covers (Grain needs a length; the reader's stream is
        unbounded). Indices past them raise `IndexError`.
      element: "row" or "batch" (module docstring).
      shard_options: this host's share (a Grain `ShardOptions`; None: all rows).
    """

    def __init__(
        self,
        mixture_or_task: Any,
        cache_dir: str,
        seed: int,
        global_batch_size: int,
        sequence_length: Mapping[str, int],
        feature_converter: FeatureConverter,
        num_steps: int,
        element: str = "row",
        shard_options: Any = None,
        **reader_options: Any,
    ):
        if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
            raise DataTasksError(f"num_steps must be a positive integer (the steps to cover), got {num_steps!r}")
        if element not in ELEMENTS:
            raise DataTasksError(f"element must be one of {ELEMENTS}, got {element!r}")
        unknown = sorted(set(reader_options) - set(READER_OPTIONS))
        if unknown:
            raise DataTasksError(
                f"unknown reader option(s) {unknown} for a Grain source; it takes {READER_OPTIONS} "
                f"(the host's share comes from shard_options)"
            )
        self.host_index, self.host_count = shard_of(shard_options)
        self.num_steps, self.element = num_steps, element
        if isinstance(mixture_or_task, str):  # the object travels with a pickled source
            mixture_or_task = get_mixture_or_task(mixture_or_task, reader_options.pop("registry", None))
        self._args = dict(
            reader_options,
            mixture_or_task=mixture_or_task,
            cache_dir=cache_dir,
            seed=seed,
            global_batch_size=global_batch_size,
            sequence_length=dict(sequence_length),
            feature_converter=feature_converter,
            host_index=self.host_index,
            host_count=self.host_count,
            prefetch=0,
        )
        self._lock = threading.Lock()
        self._chunks: collections.OrderedDict[int, Future] = collections.OrderedDict()
        self._reader: DeterministicReader | None = DeterministicReader(**self._args)  # bad input fails here
        self.rows_per_step = self._reader.per_host

    # -- pickling (Grain's worker processes) ----------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_lock=None, _chunks=None, _reader=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._chunks = collections.OrderedDict()
        # The cache was checked against the task when the source was made; a function pickled
        # by value (one defined in __main__) has no source text here, so its fingerprint differs.
        self._args = dict(self._args, check_task=False)

    @property
    def reader(self) -> DeterministicReader:
        """The reader behind the source (opened again after unpickling)."""
        with self._lock:
            if self._reader is None:
                self._reader = DeterministicReader(**self._args)
            return self._reader

    # -- the RandomAccessDataSource protocol ------------------------------------------
    def __len__(self) -> int:
        return self.num_steps * (self.rows_per_step if self.element == "row" else 1)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        n = len(self)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"a Grain source index must be an integer, got {index!r}")
        i = int(index) + (n if index < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for a source of {n} {self.element}s")
        if self.element == "batch":
            return {k: v.copy() for k, v in self._batch(i).items()}
        step, row = divmod(i, self.rows_per_step)
        return {k: v[row].copy() for k, v in self._batch(step).items()}

    def __repr__(self) -> str:
        name = getattr(self._args["mixture_or_task"], "name", None)
        return (
            f"DeterministicGrainSource({name!r}, seed={self._args['seed']}, "
            f"global_batch_size={self._args['global_batch_size']}, num_steps={self.num_steps}, "
            f"element={self.element!r}, shard {self.host_index} of {self.host_count})"
        )

    def _batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's batch at `step`, from the pass of steps that holds it (computed once
        by whichever thread asks first; the others wait for it)."""
        reader = self.reader
        per_pass = reader.steps_per_call
        first = step - step % per_pass
        with self._lock:
            future = self._chunks.get(first)
            owner = future is None
            if future is None:
                future = self._chunks[first] = Future()
                while len(self._chunks) > _KEEP_CHUNKS:
                    self._chunks.popitem(last=False)
            else:
                self._chunks.move_to_end(first)
        if owner:
            try:
                future.set_result(reader.batches_at(first, min(per_pass, self.num_steps - first)))
            except BaseException as e:
                with self._lock:
                    self._chunks.pop(first, None)
                future.set_exception(e)
        return future.result()[step - first]

    def close(self) -> None:
        """Closes the reader's cache files (a later read opens them again)."""
        with self._lock:
            reader, self._reader = self._reader, None
            self._chunks.clear()
        if reader is not None:
            reader.close()


def as_grain_source(*args: Any, **kwargs: Any) -> DeterministicGrainSource:
    """A Grain random-access source over a deterministic pipeline (`DeterministicGrainSource`'s
    arguments), for `grain.DataLoader(data_source=..., sampler=grain.samplers.IndexSampler(
    len(source), shuffle=False, num_epochs=1), operations=[grain.transforms.Batch(R)])`."""
    return DeterministicGrainSource(*args, **kwargs)


def as_grain_dataset(*args: Any, **kwargs: Any) -> Any:
    """`grain.MapDataset.source(as_grain_source(...))`: the same elements through Grain's
    dataset API (`.batch(R)`, `.to_iter_dataset()`, checkpointable iterators)."""
    grain = import_grain()
    return grain.MapDataset.source(as_grain_source(*args, **kwargs))
