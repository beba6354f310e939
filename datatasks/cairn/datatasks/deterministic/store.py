"""The on-disk layout of a task cache, its format versions and the file access behind it
(the random-access reader over it is `cached_task.CachedTask`).

    <output_dir>/<task>/<split>/
      shard-00000-of-00004.array_record   records of source shard 0, shuffled within the shard,
                                          `group_size` records per ArrayRecord chunk
      lengths.npy                         int32 [num_records, len(length_features)]
      info.json                           features, counts, fingerprint, shards, source files
      stats.json                          tokens per feature, skipped examples and why
      COMPLETED                           written last (holds the format version); a cache
                                          without it is not read

Record `i` is record `i - offsets[s]` of the shard `s` whose range holds it, in chunk
`(i - offsets[s]) // group_size` of that shard. Within a shard the records are in a seeded
order (`within_shard_order`: a pure function of the shard index and the task's fingerprint),
so a chunk is not a run of consecutive source lines; `lengths.npy` follows the same order.

`chunks.npy` (format 4) holds, per chunk (shard 0's first), its byte offset and length in
its shard file and their CRC-32: a chunk is read with one ranged read (`storage.read_ranges`)
and decoded by `chunk_index.decode_chunk`, with no ArrayRecord reader open.

`info.json` (format 3 and later) records, once, when the cache is written: per shard its file name,
record count, byte size and SHA-256; the size and SHA-256 of `lengths.npy`; the task
fingerprint (`fingerprint.PARTS`) and the source description it was computed from (per
source file: pattern index, relative name, size, SHA-256). Opening a cache reads only
metadata: `COMPLETED`, `info.json`, one listing of the directory (every shard present with
its recorded size), the `.npy` header of the lengths (memory-mapped when local). Reading
every byte again is `verify.verify_cache`'s job.

All file access goes through the few helpers below (`exists`, `read_text`, `read_json`,
`open_read`, `list_sizes`, `file_size`, `load_npy`), all through `cairn.storage`: a cache
may live at a URL (`gs://bucket/cache`); its chunks are then ranged GETs (formats 2 and 3:
its shards are opened by array-record itself) and its lengths and chunk index copied once
per host (by content) to a local file and memory-mapped.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from typing import IO, Any

import numpy as np

from cairn import storage
from cairn.datatasks import url_sources
from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.seeds import derive
from cairn.datatasks.errors import DataTasksError

INFO, STATS, LENGTHS, COMPLETED = "info.json", "stats.json", "lengths.npy", "COMPLETED"
CHUNKS = "chunks.npy"
# 1: shards with record counts only, absolute source file names in the fingerprint.
# 2: shards with byte sizes and SHA-256, lengths.npy size and SHA-256, the source files by
#    relative name in `info["source"]`, the format version in COMPLETED.
# 3: chunked shards (`info["group_size"]` records per ArrayRecord chunk, read a chunk per
#    request), records shuffled within each shard (`info["record_order"]`, `shuffle_key`).
# 4: format 3 plus `chunks.npy` (`info["chunks"]`): each chunk's byte offset, length and
#    CRC-32, so a chunk is one ranged read decoded without an ArrayRecord reader.
FORMAT_VERSION = 4
READABLE_FORMATS = (2, 3, 4)  # 2 reads as it is (group_size 1, source order); 2 and 3 through readers
FORMATS = {
    2: "one record per chunk, source order",
    3: "chunked shards read through an open ArrayRecord reader per shard",
    4: "chunked shards with a chunk index: a chunk is one ranged read, no shard kept open",
}
RECORD_ORDER_SHUFFLED = "shuffled_within_shards"


class CacheFormatError(DataTasksError):
    """A cache written in another format version than this library reads: re-cache it."""


class CacheMismatchError(DataTasksError):
    """A cache built from another task definition (preprocessors, features, vocabulary or
    source files) than the task it is read for."""


class CacheIntegrityError(DataTasksError):
    """A cache whose files do not match its own metadata (a shard missing, truncated or of
    another size): run `verify_cache` for the full picture, then re-cache."""


# -- file access (the only functions here that touch storage) -------------------------------


def _is_local(path: str) -> bool:
    return not storage.is_url(path)


def join(base: str, *parts: str) -> str:
    """`base/part/...` (a URL stays a URL)."""
    return storage.join(base, *parts)


def exists(path: str) -> bool:
    return os.path.exists(path) if _is_local(path) else storage.path(path).exists()


def read_text(path: str) -> str:
    return storage.read_text(path)


def read_json(path: str) -> Any:
    return json.loads(read_text(path))


def open_read(path: str) -> IO[bytes]:
    """A binary file object for reading (a context manager; ranged reads at a URL)."""
    return url_sources.open_binary(path)


def list_sizes(directory: str) -> dict[str, int]:
    """`{file name: size in bytes}` of the files directly in `directory`: one listing."""
    return storage.sizes(directory)


def file_size(path: str) -> int:
    """The size of one file (one stat)."""
    if _is_local(path):
        return os.stat(path).st_size
    fs, inner = storage.filesystem(path)
    return int(fs.size(inner))


def local_copy_dir() -> str:
    """Where caches at URLs keep local copies of their lengths (`$CAIRN_CACHE_HOME/lengths`,
    default `~/.cache/cairn/lengths`), named by content so a copy is never stale."""
    home = os.environ.get("CAIRN_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "cairn")
    return os.path.join(home, "lengths")


def load_npy(path: str, sha256: str | None = None) -> np.ndarray:
    """An `.npy` file of the cache (`lengths.npy`, `chunks.npy`), memory-mapped (nothing is
    read until used). At a URL it is first copied to `local_copy_dir()/<sha256>.npy` (once
    per host and content: the SHA-256 info.json records), so a restart reads none of it from
    the bucket."""
    if _is_local(path):
        return np.load(path, mmap_mode="r")
    if not sha256:
        with open_read(path) as f:
            return np.load(f)
    local = os.path.join(local_copy_dir(), f"{sha256}.npy")
    if not os.path.exists(local):
        data = storage.read_bytes(path)
        try:
            storage.write_bytes(local, data)
        except OSError as e:  # a read-only or full home: keep the lengths in memory instead
            print(
                f"cairn: no local copy of {path} ({e.strerror}: {local_copy_dir()}); reading it into memory",
                file=sys.stderr,
            )
            return np.load(io.BytesIO(data))
    return np.load(local, mmap_mode="r")


def write_json(path: str, obj: Any) -> None:
    """Writes `obj` as sorted, indented JSON, atomically (a rename locally, one upload at a URL)."""
    storage.write_text(path, json.dumps(obj, sort_keys=True, indent=1))


# -- layout ------------------------------------------------------------------------------


def task_dir(output_dir: str, task_name: str, split: str) -> str:
    """Where the cache of `task_name`/`split` lives under `output_dir`."""
    safe = re.sub(r"[^\w.\-]", "_", task_name)
    return storage.join(output_dir, safe, split)


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def completed_marker() -> str:
    """The content of `COMPLETED`: the format version (read without parsing info.json)."""
    return json.dumps({"format_version": FORMAT_VERSION}) + "\n"


def format_version(path: str) -> int | None:
    """The format version a complete cache at `path` was written in (1 for the first
    format, whose `COMPLETED` says `ok`); None when there is no `COMPLETED`."""
    marker = storage.join(path, COMPLETED)
    if not exists(marker):
        return None
    try:
        return int(json.loads(read_text(marker)).get("format_version", 1))
    except (ValueError, AttributeError):
        return 1


def cache_state(path: str) -> str:
    """`"complete"` (this format), `"older"` (complete, an older format this version still
    reads: callers that cache what is missing re-cache it, `recache_notice`), `"outdated"`
    (complete, a format this version cannot read: re-cache it), `"incomplete"` (files but
    no `COMPLETED`) or `"missing"`."""
    version = format_version(path)
    if version == FORMAT_VERSION:
        return "complete"
    if version in READABLE_FORMATS:
        return "older"
    if version is not None:
        return "outdated"
    return "incomplete" if exists(path) else "missing"


def is_completed(path: str) -> bool:
    """True when `path` holds a complete cache in this format. A cache of an older format
    (readable or not) counts as not complete, so callers that cache what is missing
    (`overwrite=True`) re-cache it."""
    return cache_state(path) == "complete"


def recache_notice(path: str) -> str | None:
    """The one line a caller that re-caches what is missing prints for a complete cache
    of an older format (None when `path` holds none)."""
    state = cache_state(path)
    if state not in ("older", "outdated"):
        return None
    return (
        f"cairn: re-caching {path}: it was written in cache format {format_version(path)}; this "
        f"version writes format {FORMAT_VERSION} ({FORMATS[FORMAT_VERSION]})"
    )


def clear_hint(path: str) -> str:
    return (
        f"delete it (`rm -r {path}`, or `gcloud storage rm -r` for a bucket) or rerun cache_tasks with "
        f"--overwrite (overwrite=True)"
    )


def verify_hint(path: str, task: str | None, split: str | None) -> str:
    cache_dir = os.path.dirname(os.path.dirname(path.rstrip("/"))) or "."
    return (
        f"run `bazel run //launchers:verify_cache -- --cache_dir={cache_dir} "
        f"--tasks={task or '<task>'} --split={split or '<split>'} --module_import=<module>` "
        f"(or `--config=...`; `verify_cache(...)` in Python) to check every byte"
    )


def outdated_error(path: str, name: str | None = None) -> CacheFormatError:
    return CacheFormatError(
        f"cache {path!r}{f' of task {name!r}' if name else ''} was written in format "
        f"{format_version(path)} by another cairn-datatasks; this version reads formats "
        f"{', '.join(map(str, READABLE_FORMATS))} (sizes and checksums of every shard, source files by "
        f"relative name). Re-cache it: {clear_hint(path)}, then cache again"
    )


def within_shard_order(shuffle_key: str, shard: int, num_records: int) -> np.ndarray:
    """`order[j]`: the source position (within shard `shard`) of the shard's record `j`: a
    seeded permutation that depends only on the shard index and `shuffle_key` (the task's
    fingerprint, `info["shuffle_key"]`)."""
    if num_records == 0:
        return np.zeros([0], np.int64)
    return Permutation(int(num_records), derive(shuffle_key, "within_shard", int(shard))).range(0, int(num_records))
