"""`GrainDataSource`: Grain random-access data as a Cairn source, usable in a `Task`.

Each split is a `grain.MapDataset` or any Grain `RandomAccessDataSource` (an object with
`__len__` and `__getitem__`). Element `i` of the split is example `i` of the source: a dict
of features (numbers, strings, bytes or NumPy arrays of them) or one such value. `None`
elements (what a `MapDataset.filter` leaves) are skipped. Shard `k` of `n` (`ShardInfo`, or
the cache job's shards with `num_shards=n`) is a contiguous range of indices, split as Grain's
`even_split` splits (the remainder to the first shards), so a cache shard holds a contiguous range of it;
`shuffle=True` reads the shard's indices in a seeded order.

Grain itself is never imported here: the source is read through `len` and `[i]`, in the
thread that iterates the `tf.data` pipeline (one `tf.numpy_function` per element,
`stateful=False`, over a range, so the iterator checkpoints like any other source).

A cache's fingerprint of this source (`fingerprint_description`) holds each split's length,
the Grain pipeline's stages (their `str`: type and transform names, without Grain's
file:line), a SHA-256 of five elements evenly spaced from the first to the last (where one is
filtered out, the next that is not), and the optional `fingerprint` string: a change
elsewhere in the data is not seen, so give a new `fingerprint` (e.g. a data version) then.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import DataSource, ShardInfo, _seeded_order, pseudo_shards
from cairn.datatasks.stats import DataStats
from cairn.datatasks.tf_data import map_inline

# Left out of the stages' descriptions: memory addresses, and the file:line Grain adds to a
# transform's name (the last parts of an absolute path: another clone would not match).
_UNSTABLE = re.compile(r" at 0x[0-9a-fA-F]+| @ [^,()]*:\d+")
_ONE = ""  # the key of an element that is one value, not a dict


def even_split(n: int, index: int, count: int) -> tuple[int, int]:
    """`[start, end)` of shard `index` of `count` over `n` indices: Grain's `even_split`
    without dropping the remainder (the first `n % count` shards take one more)."""
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _array(value: Any, where: str) -> np.ndarray:
    """One feature value as an array: numbers as they are, text as bytes (an object array)."""
    if isinstance(value, (str, bytes)):
        return np.array(value.encode() if isinstance(value, str) else value, dtype=object)
    if isinstance(value, Mapping):
        raise DataTasksError(f"{where} is a dict; a GrainDataSource element is one dict of features, not nested")
    a = np.asarray(value)
    if a.dtype.kind in "biuf":
        return a
    if a.dtype.kind in "USO":
        flat = [x.encode() if isinstance(x, str) else x for x in a.reshape(-1).tolist()]
        if all(isinstance(x, bytes) for x in flat):
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            return out.reshape(a.shape)
    raise DataTasksError(f"{where} has dtype {a.dtype}; expected numbers, bool, str or bytes")


def _features(element: Any, where: str) -> dict[str, np.ndarray]:
    """`{feature: array}` of one element (`{_ONE: array}` when it is one value)."""
    if isinstance(element, Mapping):
        bad = [k for k in element if not isinstance(k, str) or not k]
        if bad:
            raise DataTasksError(f"{where} has feature names {bad}; they must be non-empty strings")
        return {k: _array(v, f"{where} feature {k!r}") for k, v in element.items()}
    return {_ONE: _array(element, where)}


def _empty(dtype: Any, rank: int) -> np.ndarray:
    """An empty value of a feature's dtype and rank (a filtered element's placeholder)."""
    if dtype == tf.string:
        return np.full((0,) * rank, b"", dtype=object)
    return np.zeros((0,) * rank, dtype.as_numpy_dtype)


def _tf_dtype(a: np.ndarray) -> Any:
    """The `tf.DType` of a feature array (`_array`'s object arrays hold bytes: tf.string)."""
    return tf.string if a.dtype == object else tf.as_dtype(a.dtype)


def _kind(a: np.ndarray) -> str:
    return "string" if a.dtype == object else a.dtype.name


def _digest(element: Any) -> str:
    """SHA-256 of an element's features: names, kinds, shapes and values."""
    h = hashlib.sha256()
    if element is None:
        return h.hexdigest()
    for k, a in sorted(_features(element, "element").items()):
        h.update(repr((k, _kind(a), a.shape)).encode())
        if a.dtype == object:  # each string with its length, so no two sequences join alike
            h.update(b"".join(len(x).to_bytes(8, "little") + x for x in a.reshape(-1)))
        else:
            h.update(a.tobytes())
    return h.hexdigest()


def _sample(data: Any, n: int, points: int = 5, scan: int = 16) -> dict[str, str]:
    """`{index: SHA-256}` of the elements at `points` evenly spaced indices; where one is
    None (filtered out), the next element that is not, within `scan` indices."""
    out = {}
    for p in sorted({(n - 1) * k // (points - 1) for k in range(points)} if n else set()):
        i = next((j for j in range(p, min(p + scan, n)) if data[j] is not None), p)
        out[str(i)] = _digest(data[i])
    return out


def _stages(data: Any) -> list[str]:
    """The Grain pipeline behind `data`, stage by stage (a plain source: its type and repr)."""
    parents = getattr(data, "parents", None)
    if parents is None:
        if isinstance(data, (list, tuple)):
            return [type(data).__name__]
        return [f"{type(data).__qualname__}: {_UNSTABLE.sub('', repr(data))[:2000]}"]
    return [_UNSTABLE.sub("", str(data))] + [s for p in parents for s in _stages(p)]


class GrainDataSource(DataSource):
    """A Cairn source over Grain random-access data, per split.

    Args:
      split_to_dataset: `{split: grain.MapDataset or RandomAccessDataSource}`.
      num_shards: the shards `list_shards` names (the cache job writes one cache shard per
        source shard, in parallel); each is a contiguous range of indices.
      fingerprint: a string that joins the cache fingerprint (change it when the data
        changes in a way the sampled elements do not show).
    """

    def __init__(self, split_to_dataset: Mapping[str, Any], num_shards: int = 1, fingerprint: str | None = None):
        if not isinstance(split_to_dataset, Mapping) or not split_to_dataset:
            raise DataTasksError(
                f"GrainDataSource needs {{split: MapDataset}} with at least one split, got {split_to_dataset!r}"
            )
        for split, data in split_to_dataset.items():
            if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
                raise DataTasksError(
                    f"GrainDataSource split {split!r}: {type(data).__name__} has no random access (len and [i]); "
                    f"give a grain.MapDataset or RandomAccessDataSource (not an IterDataset)"
                )
            if len(data) >= sys.maxsize:
                raise DataTasksError(
                    f"GrainDataSource split {split!r} is unbounded (a repeat()?); give a dataset of finite length"
                )
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
            raise DataTasksError(f"GrainDataSource num_shards must be an int >= 1, got {num_shards!r}")
        super().__init__(list(split_to_dataset))
        self._datasets = dict(split_to_dataset)
        self._num_shards = num_shards
        self._fingerprint = fingerprint

    def dataset(self, split: str) -> Any:
        """The Grain dataset or source of `split`."""
        self._check_split(split)
        return self._datasets[split]

    def list_shards(self, split: str) -> list[str]:
        self._check_split(split)
        return pseudo_shards(split, self._num_shards)

    def fingerprint_description(self, split: str) -> dict[str, Any]:
        """What a cache fingerprint records of `split` (module docstring); cheap: a few reads."""
        data = self.dataset(split)
        n = len(data)
        return {"length": n, "stages": _stages(data), "sample": _sample(data, n), "fingerprint": self._fingerprint}

    def _spec(self, split: str, data: Any, start: int) -> dict[str, tuple[Any, int]]:
        """`{feature: (tf dtype, rank)}` of the first element that is not None, from `start`
        on (the shard's first index), then from the split's beginning."""
        n = len(data)
        for i in [*range(start, n), *range(start)]:
            element = data[i]
            if element is not None:
                arrays = _features(element, f"GrainDataSource split {split!r} element {i}")
                return {k: (_tf_dtype(a), a.ndim) for k, a in arrays.items()}
        raise DataTasksError(f"GrainDataSource split {split!r} has no element (all {n} are empty or filtered out)")

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        """The examples of `split` for this shard: in index order, or a seeded order."""
        data = self.dataset(split)
        index, count = (shard_info.index, shard_info.num_shards) if shard_info is not None else (0, 1)
        start, end = even_split(len(data), index, count)
        spec = self._spec(split, data, start)
        keys = sorted(spec)
        order = _seeded_order(end - start, seed) if shuffle else np.arange(end - start)

        def fetch(i: np.ndarray) -> list[np.ndarray]:
            j = start + int(order[int(i)])
            element = data[j]
            if element is None:  # filtered out: a placeholder the filter below drops
                return [np.array(False)] + [_empty(*spec[k]) for k in keys]
            where = f"GrainDataSource split {split!r} element {j}"
            arrays = _features(element, where)
            if sorted(arrays) != keys:
                raise DataTasksError(f"{where} has features {sorted(arrays)}; the first element had {keys}")
            for k in keys:
                a, (dtype, rank) = arrays[k], spec[k]
                if _tf_dtype(a) != dtype or a.ndim != rank:
                    raise DataTasksError(
                        f"{where} feature {k!r} is {_tf_dtype(a).name} of rank {a.ndim}; "
                        f"the first element had {dtype.name} of rank {rank}"
                    )
            return [np.array(True)] + [arrays[k] for k in keys]

        def read(i: Any) -> tuple:
            out = tf.numpy_function(fetch, [i], [tf.bool] + [spec[k][0] for k in keys], stateful=False)
            for t, k in zip(out[1:], keys):
                t.set_shape([None] * spec[k][1])
            out[0].set_shape([])
            return tuple(out)

        def structure(present: Any, *values: Any) -> Any:
            return values[0] if keys == [_ONE] else dict(zip(keys, values))

        ds = map_inline(tf.data.Dataset.range(end - start), read)
        ds = ds.filter(lambda present, *values: present)
        return map_inline(ds, structure)
