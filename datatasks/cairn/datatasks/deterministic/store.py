"""The on-disk layout of a task cache and the random-access reader over it.

    <output_dir>/<task>/<split>/
      shard-00000-of-00004.array_record   records of source shard 0, in source order
      lengths.npy                         int32 [num_records, len(length_features)]
      info.json                           features, counts, fingerprint, shards
      stats.json                          tokens per feature, skipped examples and why
      COMPLETED                           written last; a cache without it is not read

Record `i` is record `i - offset[s]` of the shard `s` whose range holds it.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from cairn.datatasks.deterministic.fingerprint import mismatched_parts, task_fingerprint
from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError

INFO, STATS, LENGTHS, COMPLETED = "info.json", "stats.json", "lengths.npy", "COMPLETED"
FORMAT_VERSION = 1


def task_dir(output_dir: str, task_name: str, split: str) -> str:
    """Where the cache of `task_name`/`split` lives under `output_dir`."""
    safe = re.sub(r"[^\w.\-]", "_", task_name)
    return os.path.join(output_dir, safe, split)


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def is_completed(path: str) -> bool:
    return tf.io.gfile.exists(os.path.join(path, COMPLETED))


def read_json(path: str) -> Any:
    with tf.io.gfile.GFile(path, "r") as f:
        return json.load(f)


def write_json(path: str, obj: Any) -> None:
    """Writes `obj` as sorted, indented JSON (via a temporary name, then a rename)."""
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps(obj, sort_keys=True, indent=1))
    tf.io.gfile.rename(tmp, path, overwrite=True)


def clear_hint(path: str) -> str:
    return (f"delete it (`rm -r {path}`, or tf.io.gfile.rmtree) or rerun cache_tasks with "
            f"--overwrite (overwrite=True)")


class CachedTask:
    """Random access to the records of one cached task split.

    Refuses a cache without `COMPLETED`, and (when `task` is given) one whose fingerprint
    does not match the task's; `check_source_files=False` skips hashing the source files.
    """

    def __init__(self, path: str, task: Any = None, split: str = "train",
                 check_source_files: bool = True):
        self.path = path
        name = getattr(task, "name", None)
        if not is_completed(path):
            raise DataTasksError(
                f"cache {path!r}{f' of task {name!r}' if name else ''} lacks {COMPLETED}: it "
                f"is incomplete or still being written; {clear_hint(path)}, then cache again")
        self.info = read_json(os.path.join(path, INFO))
        if task is not None:
            self._check(task, split, check_source_files)
        self.specs = {k: FeatureSpec(**v) for k, v in self.info["features"].items()}
        self.num_records = int(self.info["num_records"])
        self.length_features: list[str] = list(self.info["length_features"])
        with tf.io.gfile.GFile(os.path.join(path, LENGTHS), "rb") as f:
            self.lengths = np.load(f)
        self._offsets = np.cumsum([0] + [s["num_records"] for s in self.info["shards"]])
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _check(self, task: Any, split: str, check_source_files: bool) -> None:
        if self.info.get("task") != task.name or self.info.get("split") != split:
            raise DataTasksError(f"cache {self.path!r} holds task {self.info.get('task')!r} "
                                 f"split {self.info.get('split')!r}, not task {task.name!r} "
                                 f"split {split!r}")
        cached = self.info["fingerprint"]
        current = task_fingerprint(task, split) if check_source_files else dict(
            task_fingerprint(task, split, with_source=False), source=cached.get("source"))
        bad = mismatched_parts(cached, current)
        if bad:
            diff = "; ".join(f"{p}: cache {cached.get(p, '')[:12]} vs task "
                             f"{current.get(p, '')[:12]}" for p in bad)
            raise DataTasksError(
                f"cache {self.path!r} does not match task {task.name!r}: the task's "
                f"{', '.join(bad)} changed since it was cached ({diff}); {clear_hint(self.path)} "
                f"and cache again")

    def _reader(self, shard: int) -> Any:
        if shard not in self._readers:
            from array_record.python.array_record_module import ArrayRecordReader

            name = self.info["shards"][shard]["file"]
            self._readers[shard] = ArrayRecordReader(os.path.join(self.path, name),
                                                     "readahead_buffer_size:0")
        return self._readers[shard]

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at `indices` (any order), read in one batch per shard."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_records):
            raise IndexError(f"cache {self.path!r} has {self.num_records} records; asked for "
                             f"{idx.min()}..{idx.max()}")
        shard = np.searchsorted(self._offsets, idx, side="right") - 1
        out: list[bytes] = [b""] * idx.size
        with self._lock:
            for s in np.unique(shard):
                where = np.nonzero(shard == s)[0]
                got = self._reader(int(s)).read((idx[where] - self._offsets[s]).tolist())
                for w, rec in zip(where.tolist(), got):
                    out[w] = rec
        return out

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()
