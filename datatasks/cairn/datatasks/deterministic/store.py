"""The on-disk layout of a task cache and the random-access reader over it.

    <output_dir>/<task>/<split>/
      shard-00000-of-00004.array_record   records of source shard 0, in source order
      lengths.npy                         int32 [num_records, len(length_features)]
      info.json                           features, counts, fingerprint, shards, source files
      stats.json                          tokens per feature, skipped examples and why
      COMPLETED                           written last (holds the format version); a cache
                                          without it is not read

Record `i` is record `i - offset[s]` of the shard `s` whose range holds it.

`info.json` (format 2) records, once, when the cache is written: per shard its file name,
record count, byte size and SHA-256; the size and SHA-256 of `lengths.npy`; the task
fingerprint (`fingerprint.PARTS`) and the source description it was computed from (per
source file: pattern index, relative name, size, SHA-256). Opening a cache reads only
metadata: `COMPLETED`, `info.json`, one listing of the directory (every shard present with
its recorded size), the `.npy` header of the lengths (memory-mapped when local). Reading
every byte again is `verify.verify_cache`'s job.

All file access goes through the few helpers below (`exists`, `read_text`, `read_json`,
`open_read`, `list_sizes`, `file_size`, `load_lengths`), all through `cairn.storage`: a cache
may live at a URL (`gs://bucket/cache`); its shards are then opened by array-record itself
and its lengths copied once per host (by content) to a local file and memory-mapped.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np

from cairn import storage
from cairn.datatasks import url_sources
from cairn.datatasks.deterministic import fingerprint as fp
from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError

INFO, STATS, LENGTHS, COMPLETED = "info.json", "stats.json", "lengths.npy", "COMPLETED"
# 1: shards with record counts only, absolute source file names in the fingerprint.
# 2: shards with byte sizes and SHA-256, lengths.npy size and SHA-256, the source files by
#    relative name in `info["source"]`, the format version in COMPLETED.
FORMAT_VERSION = 2
REMOTE_READ_THREADS = 32  # shards read at once from a bucket (see CachedTask.read)


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


def load_lengths(path: str, sha256: str | None = None) -> np.ndarray:
    """`lengths.npy`, memory-mapped (nothing is read until used). At a URL it is first copied
    to `local_copy_dir()/<sha256>.npy` (once per host and content: the SHA-256 info.json
    records), so a restart reads no lengths from the bucket."""
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
    """`"complete"` (this format), `"outdated"` (complete, another format: re-cache it),
    `"incomplete"` (files but no `COMPLETED`) or `"missing"`."""
    version = format_version(path)
    if version == FORMAT_VERSION:
        return "complete"
    if version is not None:
        return "outdated"
    return "incomplete" if exists(path) else "missing"


def is_completed(path: str) -> bool:
    """True when `path` holds a complete cache this version can read. A complete cache of
    another format version counts as not complete, so callers that cache what is missing
    (`overwrite=True`) re-cache it."""
    return cache_state(path) == "complete"


def clear_hint(path: str) -> str:
    return (
        f"delete it (`rm -r {path}`, or `gcloud storage rm -r` for a bucket) or rerun cache_tasks with "
        f"--overwrite (overwrite=True)"
    )


def verify_hint(path: str, task: str | None, split: str | None) -> str:
    cache_dir = os.path.dirname(os.path.dirname(path.rstrip("/"))) or "."
    return (
        f"run `python -m cairn.datatasks.deterministic.verify_main --cache_dir={cache_dir} "
        f"--tasks={task or '<task>'} --split={split or '<split>'} --module_import=<module>` "
        f"(or `bazel run //launchers:verify_cache -- --config=...`) to check every byte"
    )


def outdated_error(path: str, name: str | None = None) -> CacheFormatError:
    return CacheFormatError(
        f"cache {path!r}{f' of task {name!r}' if name else ''} was written in format "
        f"{format_version(path)} by an older cairn-datatasks; this version reads format "
        f"{FORMAT_VERSION} (sizes and checksums of every shard, source files by relative "
        f"name). Re-cache it: {clear_hint(path)}, then cache again"
    )


class CachedTask:
    """Random access to the records of one cached task split.

    Opening reads metadata only (O(shards), never the records or the source files):
    refuses a cache without `COMPLETED` or of another format (`CacheFormatError`), one whose
    shards are missing or not of their recorded sizes (`CacheIntegrityError`, suggesting
    `verify_cache`), and, when `task` is given, one built from another task definition
    (`CacheMismatchError`): the preprocessors, features and vocabulary are fingerprinted
    again (cheap), the source part is taken as recorded. `check_source_files=True` also
    lists the task's source files and compares their relative names and sizes with the
    recorded ones (one glob per pattern, one stat per file; no byte is read), or, for a
    source that is not made of files, the code behind it.
    """

    def __init__(self, path: str, task: Any = None, split: str = "train", check_source_files: bool = True):
        self.path = path
        name = getattr(task, "name", None)
        state = cache_state(path)
        if state == "outdated":
            raise outdated_error(path, name)
        if state != "complete":
            raise DataTasksError(
                f"cache {path!r}{f' of task {name!r}' if name else ''} lacks {COMPLETED}: it "
                f"is incomplete or still being written; {clear_hint(path)}, then cache again"
            )
        self.info = read_json(storage.join(path, INFO))
        if int(self.info.get("format_version", 1)) != FORMAT_VERSION:
            raise outdated_error(path, name)
        if task is not None:
            self._check(task, split, check_source_files)
        self._check_files(name or self.info.get("task"), self.info.get("split", split))
        self.specs = {k: FeatureSpec(**v) for k, v in self.info["features"].items()}
        self.num_records = int(self.info["num_records"])
        self.length_features: list[str] = list(self.info["length_features"])
        self.lengths = load_lengths(storage.join(path, LENGTHS), self.info["lengths"].get("sha256"))
        if self.lengths.shape != (self.num_records, len(self.length_features)):
            raise CacheIntegrityError(
                f"cache {path!r}: {LENGTHS} has shape {self.lengths.shape}, info.json says "
                f"{(self.num_records, len(self.length_features))}; "
                f"{verify_hint(path, name, split)}, then re-cache"
            )
        self._offsets = np.cumsum([0] + [s["num_records"] for s in self.info["shards"]])
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()
        # Reads from a bucket are network requests (one per record with `group_size:1`): the
        # shards of one batch are read by this many threads at once (array-record releases
        # the GIL). Local reads stay in the caller's thread.
        self._pool = (
            None
            if _is_local(path)
            else ThreadPoolExecutor(max_workers=REMOTE_READ_THREADS, thread_name_prefix="cairn-cache-read")
        )

    def _check(self, task: Any, split: str, check_source_files: bool) -> None:
        if self.info.get("task") != task.name or self.info.get("split") != split:
            raise CacheMismatchError(
                f"cache {self.path!r} holds task {self.info.get('task')!r} split "
                f"{self.info.get('split')!r}, not task {task.name!r} split {split!r}"
            )
        cached = self.info["fingerprint"]
        current = dict(fp.task_fingerprint(task, split, with_source=False), source=cached.get("source"))
        file_source = fp.is_file_source(task.source)
        if check_source_files and not file_source:  # the code behind the source: cheap
            current["source"] = fp.source_digest(fp.source_description(task, split))
        bad = fp.mismatched_parts(cached, current)
        if bad:
            diff = "; ".join(f"{p}: cache {cached.get(p, '')[:12]} vs task {current.get(p, '')[:12]}" for p in bad)
            raise CacheMismatchError(
                f"cache {self.path!r} does not match task {task.name!r}: the task's "
                f"{', '.join(bad)} changed since it was cached ({diff}); {clear_hint(self.path)} "
                f"and cache again"
            )
        if check_source_files and file_source:
            listed = {
                "type": type(task.source).__name__,
                "split": split,
                "files": [
                    {"pattern": f.pattern, "name": f.name, "size": file_size(f.path)}
                    | ({"window": [f.skip, f.take]} if getattr(f, "windowed", False) else {})
                    for f in task.source.source_files(split)
                ],
            }
            diff_lines = fp.source_differences(self.info.get("source", {}), listed, compare_content=False)
            if diff_lines:
                raise CacheMismatchError(
                    f"cache {self.path!r} does not match the source files of task "
                    f"{task.name!r}: {'; '.join(diff_lines[:5])}"
                    f"{f' (and {len(diff_lines) - 5} more)' if len(diff_lines) > 5 else ''}; "
                    f"{clear_hint(self.path)} and cache again (check_source_files=False reads "
                    f"the cache as it is)"
                )

    def _check_files(self, name: str | None, split: str) -> None:
        """Every shard and the lengths present with their recorded sizes (one listing)."""
        sizes = list_sizes(self.path)
        expected = [(s["file"], int(s["bytes"])) for s in self.info["shards"]]
        expected.append((LENGTHS, int(self.info["lengths"]["bytes"])))
        problems = []
        for file, want in expected:
            got = sizes.get(file)
            if got is None:
                problems.append(f"{file} is missing")
            elif got != want:
                problems.append(f"{file} has {got} bytes, info.json recorded {want} (truncated or replaced)")
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise CacheIntegrityError(
                f"cache {self.path!r} is damaged: {'; '.join(problems[:5])}{more}; "
                f"{verify_hint(self.path, name, split)}, then re-cache ({clear_hint(self.path)})"
            )

    def remap_lengths(self) -> None:
        """Maps `lengths.npy` afresh: the pages a full pass (the packing plan) touched leave
        this process's resident memory (they stay in the OS page cache)."""
        if isinstance(self.lengths, np.memmap):
            self.lengths = load_lengths(storage.join(self.path, LENGTHS), self.info["lengths"].get("sha256"))

    def lengths_of(self, ids: np.ndarray) -> np.ndarray:
        """`[len(ids), K]` rows of the lengths (read from the memory map: only these rows)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        k = self.lengths.shape[1]
        if k in (1, 2) and self.lengths.dtype == np.int32 and self.lengths.flags.c_contiguous:
            # One 4- or 8-byte element per row: a flat `take`, several times faster than
            # row-wise fancy indexing for the random order of a packing plan.
            flat = np.asarray(self.lengths).view(np.int32 if k == 1 else np.int64).reshape(-1)
            return np.take(flat, ids).view(np.int32).reshape(-1, k)
        return np.asarray(self.lengths[ids])

    def _reader(self, shard: int) -> Any:
        if shard not in self._readers:
            from array_record.python.array_record_module import ArrayRecordReader

            name = self.info["shards"][shard]["file"]
            # A gs:// shard is opened by array-record itself (google-cloud-cpp; its emulator
            # switch is set by cairn.storage from STORAGE_EMULATOR_HOST).
            self._readers[shard] = ArrayRecordReader(storage.join(self.path, name), "readahead_buffer_size:0")
        return self._readers[shard]

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at `indices` (any order), read in one batch per shard."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_records):
            raise IndexError(f"cache {self.path!r} has {self.num_records} records; asked for {idx.min()}..{idx.max()}")
        shard = np.searchsorted(self._offsets, idx, side="right") - 1
        out: list[bytes] = [b""] * idx.size
        groups = [(int(s), np.nonzero(shard == s)[0]) for s in np.unique(shard)]
        with self._lock:
            readers = [self._reader(s) for s, _ in groups]
            if self._pool is None or len(groups) < 2:
                results = [r.read((idx[w] - self._offsets[s]).tolist()) for r, (s, w) in zip(readers, groups)]
            else:  # at a URL every read is a request: the shards' requests in flight together
                results = list(
                    self._pool.map(
                        lambda a: a[0].read((idx[a[1][1]] - self._offsets[a[1][0]]).tolist()), zip(readers, groups)
                    )
                )
        for (_, where), got in zip(groups, results):
            for w, rec in zip(where.tolist(), got):
                out[w] = rec
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for r in self._readers.values():
            r.close()
        self._readers.clear()
