"""Writing a task cache: one shard per source shard, then `info.json`, `stats.json`,
`COMPLETED` (last). The Beam job (`cache_job`) calls `write_shard` on its workers and
`finalize` in the driver; tests may call them directly.

Everything a reader checks at start-up is computed here, once: each shard's record count,
byte size and SHA-256 (of the file's bytes, hashed on the worker that wrote it, before the
copy to the output), the size and SHA-256 of `lengths.npy`, and the task fingerprint with
its source details (each source file fingerprinted by the worker that read it, so the driver
reads no source byte).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cairn import storage
from cairn.datatasks import url_sources
from cairn.datatasks.deterministic import record_stage
from cairn.datatasks.deterministic.chunk_index import chunk_ranges
from cairn.datatasks.deterministic.fingerprint import (
    file_digest,
    file_fingerprint,
    is_file_source,
    source_description,
    task_fingerprint,
)
from cairn.datatasks.deterministic.store import (
    CHUNKS,
    COMPLETED,
    FORMAT_VERSION,
    FORMATS,
    INFO,
    LENGTHS,
    RECORD_ORDER_SHUFFLED,
    STATS,
    cache_state,
    clear_hint,
    completed_marker,
    format_version,
    is_completed,
    outdated_error,
    read_json,
    shard_name,
    within_shard_order,
    write_json,
)
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.sources import ShardInfo
from cairn.datatasks.stats import DataStats

# Records per ArrayRecord chunk: the reader fetches a chunk per request. 512: from a bucket,
# batch 32 packed, 0.73-0.75x local disk's rows/s and 10-11 requests per 1,000 rows, where 64
# gave 0.18-0.48x and ~180 (benchmarks/RESULTS.md, read_ahead_bench.py); a batch's mix of
# documents and sources is the same as at 64 (shuffle_quality.py; datatasks/README.md).
DEFAULT_GROUP_SIZE = 512
SHUFFLE_BATCH = 4096  # records copied at once from the unshuffled temporary file


def writer_options(group_size: int) -> str:
    """The ArrayRecord writer options of a shard with `group_size` records per chunk."""
    return f"group_size:{int(group_size)}"


def shuffle_key(task: Any, split: str) -> str:
    """The key of the within-shard shuffle: the task's fingerprint without its source part
    (computed without reading a source file, the same on every worker), and the split."""
    parts = task_fingerprint(task, split, with_source=False)
    return hashlib.sha256(json.dumps([parts, split], sort_keys=True).encode()).hexdigest()


def num_source_shards(task: Any, split: str) -> int:
    return len(task.source.list_shards(split))


def prepare(path: str, overwrite: bool) -> bool:
    """Readies `path` for a new cache; False when a complete cache is there (skip it).
    A complete cache of an older format this version reads is kept (a one-line notice); one
    it cannot read is refused (`CacheFormatError`) unless `overwrite`."""
    present = storage.file_sizes(path)
    if present or storage.path(path).exists():
        state = cache_state(path)
        if overwrite:
            storage.remove_tree(path)
        elif state == "complete":
            return False
        elif state == "older":  # readable as it is: kept (overwrite=True rewrites it)
            version = format_version(path) or 0
            print(
                f"cairn: {path} is in cache format {version} ({FORMATS.get(version, '')}); "
                f"it reads as it is; --overwrite rewrites it in format {FORMAT_VERSION}",
                file=sys.stderr,
            )
            return False
        elif state == "outdated":
            raise outdated_error(path)
        elif present:
            raise DataTasksError(
                f"cache {path!r} is incomplete (no {COMPLETED}): an earlier "
                f"job failed or is still running; {clear_hint(path)}"
            )
    if not storage.is_url(path):
        os.makedirs(path, exist_ok=True)
    return True


def _length_features(specs: dict[str, record_stage.FeatureSpec]) -> list[str]:
    return [k for k, s in specs.items() if s.rank == 1 and s.kind == "int64"]


def write_shard_files(
    path: str,
    index: int,
    count: int,
    records_iter: Iterable[bytes],
    lengths: Sequence | np.ndarray,
    features: dict,
    length_features: list,
    stats: dict | None = None,
    source_file: dict | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    shuffle: str | None = None,
) -> dict:
    """Writes shard `index` of `count` under `path`: the ArrayRecord file of `records_iter`
    (`group_size` records per chunk; written locally, hashed, then uploaded whole: never
    torn, on a bucket too), its lengths (`lengths`, read after the records are consumed, so
    a generator may fill a list) and its summary JSON with the shard's record count, byte
    size and SHA-256. `shuffle` (a key, `shuffle_key`) puts the records, and their lengths,
    in the seeded order `store.within_shard_order(shuffle, index, n)`: they are first written
    to a temporary unchunked file, then copied in that order (memory: a batch of records);
    None keeps the source order (format 2's). Returns the summary."""
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    if not isinstance(group_size, int) or group_size < 1:
        raise DataTasksError(f"group_size must be a positive integer, got {group_size!r}")
    name = shard_name(index, count)
    tmp = tempfile.mkdtemp(prefix="cairn-cache-")
    try:
        local = os.path.join(tmp, name + ".array_record")
        first = os.path.join(tmp, "unshuffled.array_record") if shuffle is not None else local
        writer = ArrayRecordWriter(first, writer_options(1 if shuffle is not None else group_size))
        num = 0
        for rec in records_iter:
            writer.write(rec)
            num += 1
        writer.close()
        arr = np.asarray(lengths, np.int32).reshape(num, len(length_features))
        if shuffle is not None:
            order = within_shard_order(shuffle, index, num)
            arr = arr[order]
            reader = ArrayRecordReader(first, "readahead_buffer_size:0")
            writer = ArrayRecordWriter(local, writer_options(group_size))
            for at in range(0, num, SHUFFLE_BATCH):
                for rec in reader.read(order[at : at + SHUFFLE_BATCH].tolist()):
                    writer.write(rec)
            writer.close()
            reader.close()
            os.remove(first)
        size, sha = file_digest(local)
        chunks = chunk_ranges(local, num, group_size)
        storage.copy_file(local, storage.join(path, name + ".array_record"))
        buf = io.BytesIO()
        np.save(buf, arr)
        storage.write_bytes(storage.join(path, name + ".lengths.npy"), buf.getvalue())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {
        "index": index,
        "file": name + ".array_record",
        "num_records": num,
        "bytes": size,
        "sha256": sha,
        "features": features,
        "length_features": list(length_features),
        "stats": dict(stats or {}),
        "tokens": {k: int(arr[:, j].sum()) for j, k in enumerate(length_features)},
        "group_size": group_size,
        "shuffle_key": shuffle,
        # Per chunk: its byte offset and length in the shard file, and their CRC-32 (the
        # cache's chunks.npy): a chunk is then one ranged read, with no ArrayRecord reader.
        "chunks": chunks.tolist(),
    }
    if source_file is not None:
        summary["source_file"] = source_file
    write_json(storage.join(path, name + ".json"), summary)
    return summary


def write_shard(task: Any, split: str, index: int, count: int, path: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict:
    """Runs the source shard `index` of `count` through the cacheable preprocessors and
    writes its records and lengths under `path` (`group_size` records per chunk, shuffled
    within the shard by `shuffle_key(task, split)`); for a file source, also fingerprints
    the source file of the shard (so the driver never reads the sources). Returns the
    shard's summary."""
    stats = DataStats()
    info = ShardInfo(index, count) if count > 1 else None
    source_file = None
    if is_file_source(task.source):
        files = task.source.source_files(split)
        if len(files) != count:
            raise DataTasksError(
                f"task {task.name!r} split {split!r}: {len(files)} source files now, {count} when the job started"
            )
        source_file = file_fingerprint(files[index])
    ds = task.source.get_dataset(split, shuffle=False, seed=0, shard_info=info, stats=stats)
    ds = task.preprocess(ds, None, seed=None, stats=stats, start=0, stop=len(task.cacheable_preprocessors))
    specs = record_stage.specs_of(ds.element_spec, task.name)
    keys = _length_features(specs)
    lengths: list[list[int]] = []

    def serialized():
        for ex in ds.as_numpy_iterator():
            lengths.append([int(np.size(ex[k])) for k in keys])
            yield record_stage.serialize(ex, specs)

    url_sources.pop_raised()
    try:
        return write_shard_files(
            path,
            index,
            count,
            serialized(),
            lengths,
            {k: {"dtype": s.dtype, "rank": s.rank} for k, s in specs.items()},
            keys,
            stats.as_dict(),
            source_file,
            group_size=group_size,
            shuffle=shuffle_key(task, split),
        )
    except Exception:
        error = url_sources.pop_raised()  # a source file's own error, not tf.data's wrapping of it
        if error is not None:
            raise error from None
        raise


def _source(task: Any, split: str, path: str, shards: list[dict]) -> dict:
    """The source description, from the shards' source file fingerprints when the workers
    made them (checked against the current listing), else computed here."""
    if not is_file_source(task.source) or any("source_file" not in s for s in shards):
        return source_description(task, split)
    files = [s["source_file"] for s in shards]
    listed = [(f.pattern, f.name) for f in task.source.source_files(split)]
    if listed != [(f["pattern"], f["name"]) for f in files]:
        raise DataTasksError(
            f"cache {path!r}: the source files of task {task.name!r} changed "
            f"while it was being cached; {clear_hint(path)} and cache again"
        )
    return source_description(task, split, files=files)


def finalize(task: Any, split: str, path: str, count: int) -> dict:
    """Merges the shard summaries into `lengths.npy`, `chunks.npy` (every chunk's byte range
    and CRC-32, `store.CHUNKS`), `info.json` (with every shard's size and SHA-256, and the
    source fingerprint details), `stats.json`, then writes `COMPLETED` (holding the format
    version). Returns the info."""
    shards = [read_json(storage.join(path, shard_name(i, count) + ".json")) for i in range(count)]
    wrong = [i for i, s in enumerate(shards) if s["index"] != i]
    if wrong:
        raise DataTasksError(
            f"cache {path!r}: the summaries of shards {wrong} name other shards; clear the cache ({clear_hint(path)})"
        )
    feats = {k: v for s in shards[:1] for k, v in s["features"].items()}
    for s in shards:
        if s["features"] != feats:
            raise DataTasksError(
                f"cache {path!r}: shard {s['index']} has features {s['features']}, shard 0 has {feats}"
            )
    keys = shards[0]["length_features"] if shards else []
    layouts = {(s.get("group_size", 1), s.get("shuffle_key")) for s in shards}
    if len(layouts) > 1:
        raise DataTasksError(
            f"cache {path!r}: the shards were written with different group sizes or shuffle keys "
            f"({sorted(layouts, key=str)}); clear the cache ({clear_hint(path)})"
        )
    group_size, key = next(iter(layouts)) if layouts else (DEFAULT_GROUP_SIZE, None)
    parts = []
    for i in range(count):
        parts.append(np.load(io.BytesIO(storage.read_bytes(storage.join(path, shard_name(i, count) + ".lengths.npy")))))
    lengths = np.concatenate(parts, 0) if parts else np.zeros([0, len(keys)], np.int32)
    del parts
    stats: dict[str, int] = {}
    for s in shards:
        for k, v in s["stats"].items():
            stats[k] = stats.get(k, 0) + v
    num = int(lengths.shape[0])
    if num == 0:
        raise DataTasksError(
            f"task {task.name!r} split {split!r}: no example survived the "
            f"cacheable preprocessors; nothing to cache (stats: {stats})"
        )
    buf = io.BytesIO()
    np.save(buf, lengths)
    data = buf.getvalue()
    storage.write_bytes(storage.join(path, LENGTHS), data)
    lengths_meta = {"file": LENGTHS, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    del data, buf
    chunks_meta = _write_chunks(path, shards, group_size)
    source = _source(task, split, path, shards)
    info = {
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "split": split,
        "num_records": num,
        "features": feats,
        "length_features": keys,
        "lengths_file": LENGTHS,
        "lengths": lengths_meta,
        "fingerprint": task_fingerprint(task, split, source=source),
        "source": source,
        "cacheable_preprocessors": len(task.cacheable_preprocessors),
        "group_size": group_size,
        "chunks": chunks_meta,
        # "shuffled_within_shards": shard s holds its source records in the order
        # store.within_shard_order(shuffle_key, s, n_s); "source": in source order.
        "record_order": RECORD_ORDER_SHUFFLED if key is not None else "source",
        "shuffle_key": key,
        "shards": [
            {"file": s["file"], "num_records": s["num_records"], "bytes": s["bytes"], "sha256": s["sha256"]}
            for s in shards
        ],
    }
    write_json(
        storage.join(path, STATS),
        {"num_records": num, "skipped": stats, "tokens": {k: sum(s["tokens"][k] for s in shards) for k in keys}},
    )
    write_json(storage.join(path, INFO), info)
    storage.write_text(storage.join(path, COMPLETED), completed_marker())
    return info


def _write_chunks(path: str, shards: list[dict], group_size: int) -> dict:
    """Writes `chunks.npy` (`[C, 3]` int64: offset, length, CRC-32 of each chunk, shard 0's
    first) from the shard summaries; returns its metadata for info.json."""
    parts: list[np.ndarray] = []
    for s in shards:
        rows = np.asarray(s.get("chunks", []), np.int64).reshape(-1, 3)
        want = -(-int(s["num_records"]) // group_size)
        if "chunks" not in s or rows.shape[0] != want:
            raise DataTasksError(
                f"cache {path!r}: shard {s['index']}'s summary lists {rows.shape[0]} chunks, not "
                f"{want} (written by another cairn-datatasks?); clear the cache ({clear_hint(path)})"
            )
        parts.append(rows)
    buf = io.BytesIO()
    np.save(buf, np.concatenate(parts, 0) if parts else np.zeros([0, 3], np.int64))
    data = buf.getvalue()
    storage.write_bytes(storage.join(path, CHUNKS), data)
    return {"file": CHUNKS, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def add_chunk_index(path: str) -> dict:
    """Upgrades a complete format 3 cache on local disk to format 4 in place: walks each
    shard's chunk headers (O(chunks) small reads, no record decoded), writes `chunks.npy`,
    then `info.json` and `COMPLETED` (last) with the new format. Shards, lengths, plans and
    the fingerprint stay as they are. Returns the new info. A cache at a URL, or not in format 3,
    is refused: re-cache it (or upgrade a local copy, then upload it)."""
    if storage.is_url(path):
        raise DataTasksError(f"add_chunk_index reads the shards' chunk headers from local disk; {path!r} is a URL")
    version = format_version(path)
    if version != 3:
        raise DataTasksError(f"cache {path!r} is in format {version}, not 3: add_chunk_index upgrades format 3 only")
    info = read_json(storage.join(path, INFO))
    group = int(info["group_size"])
    shards = [
        {
            "index": i,
            "num_records": s["num_records"],
            "chunks": chunk_ranges(storage.join(path, s["file"]), int(s["num_records"]), group).tolist(),
        }
        for i, s in enumerate(info["shards"])
    ]
    info = dict(info, format_version=FORMAT_VERSION, chunks=_write_chunks(path, shards, group))
    write_json(storage.join(path, INFO), info)
    storage.write_text(storage.join(path, COMPLETED), completed_marker())
    return info


def upgrade_in_place(path: str) -> str | None:
    """Upgrades a complete format 3 cache on local disk to this format (`add_chunk_index`: no
    record is rewritten) and returns the one-line notice to print; None, doing nothing, for any
    other cache or one at a URL (those are re-cached)."""
    if storage.is_url(path) or format_version(path) != 3:
        return None
    add_chunk_index(path)
    return (
        f"cairn: upgraded {path} from cache format 3 to {FORMAT_VERSION} in place (its chunk index, "
        f"{CHUNKS}; no record rewritten)"
    )


def cache_task_in_process(
    task: Any, split: str, path: str, overwrite: bool = False, group_size: int = DEFAULT_GROUP_SIZE
) -> bool:
    """Caches `task` without Beam (small data, tests). False when already complete."""
    if not prepare(path, overwrite):
        return False
    try:
        count = num_source_shards(task, split)
        for i in range(count):
            write_shard(task, split, i, count, path, group_size)
        finalize(task, split, path, count)
    except BaseException:
        discard(path)
        raise
    return True


def discard(path: str) -> None:
    """Removes the unfinished cache at `path` (a failed job's shards; never a complete cache)."""
    if not is_completed(path):
        storage.remove_tree(path)
