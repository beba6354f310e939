"""Writing a task cache: one shard per source shard, then `info.json`, `stats.json`,
`COMPLETED` (last). The Beam job (`cache_job`) calls `write_shard` on its workers and
`finalize` in the driver; tests may call them directly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

from cairn.datatasks.deterministic import records
from cairn.datatasks.deterministic.fingerprint import task_fingerprint
from cairn.datatasks.deterministic.store import (
    COMPLETED, FORMAT_VERSION, INFO, LENGTHS, STATS, clear_hint, is_completed, read_json,
    shard_name, write_json)
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.sources import ShardInfo
from cairn.datatasks.stats import DataStats

WRITER_OPTIONS = "group_size:1"  # one record per chunk: fast single-record random reads


def num_source_shards(task: Any, split: str) -> int:
    return len(task.source.list_shards(split))


def prepare(path: str, overwrite: bool) -> bool:
    """Readies `path` for a new cache; False when a complete cache is there (skip it)."""
    if tf.io.gfile.exists(path):
        if overwrite:
            tf.io.gfile.rmtree(path)
        elif is_completed(path):
            return False
        elif tf.io.gfile.listdir(path):
            raise DataTasksError(f"cache {path!r} is incomplete (no {COMPLETED}): an earlier "
                                 f"job failed or is still running; {clear_hint(path)}")
    tf.io.gfile.makedirs(path)
    return True


def _length_features(specs: dict[str, records.FeatureSpec]) -> list[str]:
    return [k for k, s in specs.items() if s.rank == 1 and s.kind == "int64"]


def write_shard(task: Any, split: str, index: int, count: int, path: str) -> dict:
    """Runs the source shard `index` of `count` through the cacheable preprocessors and
    writes its records and lengths under `path`. Returns the shard's summary."""
    from array_record.python.array_record_module import ArrayRecordWriter

    stats = DataStats()
    info = ShardInfo(index, count) if count > 1 else None
    ds = task.source.get_dataset(split, shuffle=False, seed=0, shard_info=info, stats=stats)
    ds = task.preprocess(ds, None, seed=None, stats=stats, start=0,
                         stop=len(task.cacheable_preprocessors))
    specs = records.specs_of(ds.element_spec, task.name)
    keys = _length_features(specs)
    name = shard_name(index, count)
    lengths: list[list[int]] = []
    tmp = tempfile.mkdtemp(prefix="cairn-cache-")
    try:
        local = os.path.join(tmp, name + ".array_record")
        writer = ArrayRecordWriter(local, WRITER_OPTIONS)
        for ex in ds.as_numpy_iterator():
            writer.write(records.serialize(ex, specs))
            lengths.append([int(np.size(ex[k])) for k in keys])
        writer.close()
        tf.io.gfile.copy(local, os.path.join(path, name + ".array_record"), overwrite=True)
        arr = np.asarray(lengths, np.int32).reshape(len(lengths), len(keys))
        np.save(os.path.join(tmp, "l.npy"), arr)
        tf.io.gfile.copy(os.path.join(tmp, "l.npy"), os.path.join(path, name + ".lengths.npy"),
                         overwrite=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {"index": index, "file": name + ".array_record", "num_records": len(lengths),
               "features": {k: {"dtype": s.dtype, "rank": s.rank} for k, s in specs.items()},
               "length_features": keys, "stats": stats.as_dict(),
               "tokens": {k: int(arr[:, j].sum()) for j, k in enumerate(keys)}}
    write_json(os.path.join(path, name + ".json"), summary)
    return summary


def finalize(task: Any, split: str, path: str, count: int) -> dict:
    """Merges the shard summaries into `lengths.npy`, `info.json`, `stats.json`, then
    writes `COMPLETED`. Returns the info."""
    shards = [read_json(os.path.join(path, shard_name(i, count) + ".json")) for i in range(count)]
    wrong = [i for i, s in enumerate(shards) if s["index"] != i]
    if wrong:
        raise DataTasksError(f"cache {path!r}: the summaries of shards {wrong} name other "
                             f"shards; clear the cache ({clear_hint(path)})")
    feats = {k: v for s in shards[:1] for k, v in s["features"].items()}
    for s in shards:
        if s["features"] != feats:
            raise DataTasksError(f"cache {path!r}: shard {s['index']} has features "
                                 f"{s['features']}, shard 0 has {feats}")
    keys = shards[0]["length_features"]
    parts = []
    for i in range(count):
        with tf.io.gfile.GFile(os.path.join(path, shard_name(i, count) + ".lengths.npy"),
                               "rb") as f:
            parts.append(np.load(f))
    lengths = np.concatenate(parts, 0) if parts else np.zeros([0, len(keys)], np.int32)
    with tf.io.gfile.GFile(os.path.join(path, LENGTHS), "wb") as f:
        np.save(f, lengths)
    stats: dict[str, int] = {}
    for s in shards:
        for k, v in s["stats"].items():
            stats[k] = stats.get(k, 0) + v
    num = int(lengths.shape[0])
    if num == 0:
        raise DataTasksError(f"task {task.name!r} split {split!r}: no example survived the "
                             f"cacheable preprocessors; nothing to cache (stats: {stats})")
    info = {"format_version": FORMAT_VERSION, "task": task.name, "split": split,
            "num_records": num, "features": feats, "length_features": keys,
            "lengths_file": LENGTHS, "fingerprint": task_fingerprint(task, split),
            "cacheable_preprocessors": len(task.cacheable_preprocessors),
            "shards": [{"file": s["file"], "num_records": s["num_records"]} for s in shards]}
    write_json(os.path.join(path, STATS), {
        "num_records": num, "skipped": stats,
        "tokens": {k: sum(s["tokens"][k] for s in shards) for k in keys}})
    write_json(os.path.join(path, INFO), info)
    with tf.io.gfile.GFile(os.path.join(path, COMPLETED), "w") as f:
        f.write("ok\n")
    return info


def cache_task_in_process(task: Any, split: str, path: str, overwrite: bool = False) -> bool:
    """Caches `task` without Beam (small data, tests). False when already complete."""
    if not prepare(path, overwrite):
        return False
    count = num_source_shards(task, split)
    for i in range(count):
        write_shard(task, split, i, count, path)
    finalize(task, split, path, count)
    return True
