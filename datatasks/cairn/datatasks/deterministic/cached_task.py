"""`CachedTask`: random access to the records of one cached task split (the layout and the
file access are `store`'s).

Opening reads metadata only (O(shards)). Reads fetch whole ArrayRecord chunks (one request
per chunk at a URL), kept decoded in an LRU bounded by bytes. A format 4 cache records every
chunk's byte range (`chunks.npy`): a chunk is one ranged read (`storage.read_ranges`: a
`pread` locally, a ranged GET at a URL) decoded by `chunk_index`, and no shard is kept open.
Older formats read through ArrayRecord readers, at most K shards open (an LRU, K from a memory
budget), so memory does not grow with the number of shards either way.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from cairn import storage
from cairn.datatasks.deterministic import cache_checks
from cairn.datatasks.deterministic.chunk_index import ChunkError, decode_chunk
from cairn.datatasks.deterministic.record_stage import FeatureSpec
from cairn.datatasks.deterministic.store import (
    COMPLETED,
    INFO,
    LENGTHS,
    READABLE_FORMATS,
    CacheIntegrityError,
    cache_state,
    clear_hint,
    load_npy,
    outdated_error,
    read_json,
    verify_hint,
)
from cairn.datatasks.errors import DataTasksError

REMOTE_READ_THREADS = 32  # shards read at once from a bucket (see CachedTask.read)
DEFAULT_CHUNK_CACHE_BYTES = 256 << 20  # decoded chunks kept per CachedTask (an LRU)
DEFAULT_OPEN_SHARDS_BYTES = 256 << 20  # open ArrayRecord readers per CachedTask (an LRU)
# What one open shard costs (measured, benchmarks/README.md "reader_scale_bench.py"): a
# fixed part (a bucket's shard holds its own HTTP client and buffers) plus its chunk index.
OPEN_SHARD_BYTES_LOCAL = 32 << 10
OPEN_SHARD_BYTES_REMOTE = 256 << 10
INDEX_BYTES_PER_CHUNK = 9
# The pages of the memory-mapped lengths that `lengths_of` touched leave this process's resident
# set every this many rows looked up (they stay in the OS page cache): under the chunk order the
# rows of a window share a few pages, and a long run would otherwise keep the whole file
# resident (800 MB at 10^8 records; benchmarks/RESULTS.md, reader_scale_bench.py).
RELEASE_LENGTH_PAGES_EVERY = 1 << 16


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

    Reading: `read` fetches whole chunks (`group_size` records; 1 for format 2) and keeps
    the decoded ones in an LRU of at most `chunk_cache_bytes`. Format 4: each chunk is one
    ranged read of the bytes `chunks.npy` records, its CRC-32 checked, decoded here; no
    reader is kept (`max_open_shards` is 0). Formats 2 and 3: at most `max_open_shards`
    ArrayRecord readers stay open (`open_shards_bytes` over the estimated cost of one open
    shard: `OPEN_SHARD_BYTES_REMOTE` at a URL, `OPEN_SHARD_BYTES_LOCAL` on disk, plus its
    chunk index), the least recently used closed first. Thread-safe.
    """

    def __init__(
        self,
        path: str,
        task: Any = None,
        split: str = "train",
        check_source_files: bool = True,
        chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        open_shards_bytes: int = DEFAULT_OPEN_SHARDS_BYTES,
    ):
        self.path = path
        name = getattr(task, "name", None)
        state = cache_state(path)
        if state == "outdated":
            raise outdated_error(path, name)
        if state not in ("complete", "older"):
            raise DataTasksError(
                f"cache {path!r}{f' of task {name!r}' if name else ''} lacks {COMPLETED}: it "
                f"is incomplete or still being written; {clear_hint(path)}, then cache again"
            )
        self.info = read_json(storage.join(path, INFO))
        if int(self.info.get("format_version", 1)) not in READABLE_FORMATS:
            raise outdated_error(path, name)
        if task is not None:
            cache_checks.check_task(self.info, self.path, task, split, check_source_files)
        cache_checks.check_files(self.info, self.path, name or self.info.get("task"), self.info.get("split", split))
        self.specs = {k: FeatureSpec(**v) for k, v in self.info["features"].items()}
        self.num_records = int(self.info["num_records"])
        self.length_features: list[str] = list(self.info["length_features"])
        self.lengths = load_npy(storage.join(path, LENGTHS), self.info["lengths"].get("sha256"))
        self._looked_up = 0  # rows read by lengths_of since its pages were last released
        if self.lengths.shape != (self.num_records, len(self.length_features)):
            raise CacheIntegrityError(
                f"cache {path!r}: {LENGTHS} has shape {self.lengths.shape}, info.json says "
                f"{(self.num_records, len(self.length_features))}; "
                f"{verify_hint(path, name, split)}, then re-cache"
            )
        # Format 2 has no group_size (one record per chunk) and keeps the source order.
        self.group_size = int(self.info.get("group_size", 1))
        if self.group_size < 1:
            raise CacheIntegrityError(f"cache {path!r}: info.json has group_size {self.group_size}; re-cache it")
        counts = np.asarray([int(s["num_records"]) for s in self.info["shards"]], np.int64)
        self.offsets: np.ndarray = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # The first global chunk number of each shard (chunk k of shard s is chunk_base[s] + k).
        self._chunk_base = np.concatenate([[0], np.cumsum(-(-counts // self.group_size))]).astype(np.int64)
        # Format 4: [C, 3] (offset, length, CRC-32) of every chunk; read by ranges, no reader.
        self._ranges: np.ndarray | None = None
        self._files = [storage.join(path, s["file"]) for s in self.info["shards"]]
        meta = self.info.get("chunks")
        if meta:
            self._ranges = load_npy(storage.join(path, meta["file"]), meta.get("sha256"))
            if self._ranges.shape != (self.num_chunks, 3):
                raise CacheIntegrityError(
                    f"cache {path!r}: {meta['file']} has shape {self._ranges.shape}, the shards hold "
                    f"{self.num_chunks} chunks; {verify_hint(path, name, split)}, then re-cache"
                )
        fixed = OPEN_SHARD_BYTES_LOCAL if not storage.is_url(path) else OPEN_SHARD_BYTES_REMOTE
        cost = fixed + INDEX_BYTES_PER_CHUNK * int(np.diff(self._chunk_base).max(initial=0))
        self.max_open_shards = 0 if self._ranges is not None else max(1, int(open_shards_bytes) // cost)
        self.chunk_cache_bytes = max(0, int(chunk_cache_bytes))
        self._readers: OrderedDict[int, Any] = OrderedDict()  # LRU: least recently used first
        self._users: dict[int, int] = {}  # shard -> reads using its reader now (never closed)
        self._opening: dict[int, Future] = {}  # shard -> its reader, being opened by a thread
        self._inflight: dict[int, Future] = {}  # chunk -> its records, being fetched by a thread
        self._chunks: OrderedDict[int, list[bytes]] = OrderedDict()  # LRU of decoded chunks
        self._chunk_bytes = 0
        self._stats = {"chunk_fetches": 0, "chunk_hits": 0, "shard_opens": 0, "shard_closes": 0}
        self._lock = threading.Lock()
        # Reads from a bucket are network requests (one per chunk): the shards of one batch
        # are read by this many threads at once (array-record releases the GIL). Local reads
        # stay in the caller's thread.
        self._pool = (
            None
            if not storage.is_url(path) or self._ranges is not None
            else ThreadPoolExecutor(max_workers=REMOTE_READ_THREADS, thread_name_prefix="cairn-cache-read")
        )

    def _release_length_pages(self) -> None:
        """Drops the mapped pages of `lengths.npy` from this process (`MADV_DONTNEED`; a read
        maps them again from the page cache). Nothing to do for lengths held in memory."""
        mapped = getattr(self.lengths, "_mmap", None)
        if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapped.madvise(mmap.MADV_DONTNEED)

    def remap_lengths(self) -> None:
        """Maps `lengths.npy` afresh: the pages a full pass (the packing plan) touched leave
        this process's resident memory (they stay in the OS page cache)."""
        if isinstance(self.lengths, np.memmap):
            self.lengths = load_npy(storage.join(self.path, LENGTHS), self.info["lengths"].get("sha256"))

    def lengths_of(self, ids: np.ndarray) -> np.ndarray:
        """`[len(ids), K]` rows of the lengths (read from the memory map: only these rows;
        every `RELEASE_LENGTH_PAGES_EVERY` rows the mapped pages leave the resident set)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        self._looked_up += ids.size
        if self._looked_up >= RELEASE_LENGTH_PAGES_EVERY:
            self._looked_up = 0
            self._release_length_pages()
        k = self.lengths.shape[1]
        if k in (1, 2) and self.lengths.dtype == np.int32 and self.lengths.flags.c_contiguous:
            # One 4- or 8-byte element per row: a flat `take`, several times faster than
            # row-wise fancy indexing for the random order of a packing plan.
            flat = np.asarray(self.lengths).view(np.int32 if k == 1 else np.int64).reshape(-1)
            return np.take(flat, ids).view(np.int32).reshape(-1, k)
        return np.asarray(self.lengths[ids])

    @property
    def num_chunks(self) -> int:
        return int(self._chunk_base[-1])

    def chunk_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The global chunk number of each record in `ids` (the chunks of shard 0 first;
        chunk k of shard s holds its local records `[k * G, min((k + 1) * G, n_s))`)."""
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        return self._chunk_base[shard] + (idx - self.offsets[shard]) // self.group_size

    def stats(self) -> dict[str, int]:
        """Counters since opening: `chunk_fetches` (chunks read from the files: at a URL one
        request each; with group_size 1 one per record read), `chunk_hits` (chunks served
        from the LRU, or by another thread's fetch under way), `shard_opens`, `shard_closes`
        (ArrayRecord readers opened and closed by the open-shard LRU), `open_shards`,
        `cached_chunk_bytes`."""
        with self._lock:
            return dict(self._stats, open_shards=len(self._readers), cached_chunk_bytes=self._chunk_bytes)

    def _open(self, shards: Sequence[int]) -> list[Any]:
        """Readers of `shards` (distinct, at most `max_open_shards`), pinned until `_release`:
        opens those not open (at a URL in parallel: an open is requests for the footer and the
        chunk index), outside the lock, and closes the least recently used unpinned others
        beyond the bound. A shard another thread is opening is waited for, not opened twice."""
        from array_record.python.array_record_module import ArrayRecordReader

        mine: list[int] = []
        waits: list[Future] = []
        with self._lock:
            for s in shards:
                self._users[s] = self._users.get(s, 0) + 1
                if s in self._readers:
                    self._readers.move_to_end(s)
                elif s in self._opening:
                    waits.append(self._opening[s])
                else:
                    self._opening[s] = Future()
                    mine.append(s)
            self._evict(room=len(mine))

        def open_one(s: int) -> Any:
            # A gs:// shard is opened by array-record itself (google-cloud-cpp; its emulator
            # switch is set by cairn.storage from STORAGE_EMULATOR_HOST).
            return ArrayRecordReader(storage.join(self.path, self.info["shards"][s]["file"]), "readahead_buffer_size:0")

        try:
            if mine:
                opened = list(self._pool.map(open_one, mine) if self._pool and len(mine) > 1 else map(open_one, mine))
                with self._lock:
                    for s, reader in zip(mine, opened):
                        self._readers[s] = reader
                        self._opening.pop(s).set_result(reader)
                        self._stats["shard_opens"] += 1
                    self._evict()
            for f in waits:
                f.result()
        except BaseException as e:
            with self._lock:
                for s in mine:
                    if s in self._opening:
                        self._opening.pop(s).set_exception(e)
            self._release(shards)
            raise
        with self._lock:
            return [self._readers[s] for s in shards]

    def _release(self, shards: Sequence[int]) -> None:
        """Unpins `shards` (after `_open`), closing readers beyond the bound that were pinned."""
        with self._lock:
            for s in shards:
                self._users[s] -= 1
                if not self._users[s]:
                    del self._users[s]
            self._evict()

    def _evict(self, room: int = 0) -> None:
        """Closes the least recently used unpinned readers until `room` more fit in the bound
        (pinned ones are never closed: with concurrent reads the bound may be exceeded by the
        shards in use). Called with the lock held."""
        excess = len(self._readers) + room - self.max_open_shards
        for s in [s for s in self._readers if s not in self._users][: max(0, excess)]:
            self._readers.pop(s).close()
            self._stats["shard_closes"] += 1

    def _run(self, jobs: list[tuple[int, Any]]) -> list[list[bytes]]:
        """`jobs` = `[(shard, arg of ArrayRecordReader.read), ...]`, read in waves of at most
        `max_open_shards` shards; at a URL each wave's reads are in flight together. Called
        without the lock: reads of other threads proceed at the same time."""
        out: list[list[bytes]] = [[] for _ in jobs]
        by_shard: dict[int, list[int]] = {}
        for j, (s, _) in enumerate(jobs):
            by_shard.setdefault(s, []).append(j)
        order = list(by_shard)
        for at in range(0, len(order), self.max_open_shards):
            wave = order[at : at + self.max_open_shards]
            readers = dict(zip(wave, self._open(wave)))
            try:
                todo = [j for s in wave for j in by_shard[s]]
                calls = [(readers[jobs[j][0]], jobs[j][1]) for j in todo]
                if self._pool is None or len(calls) < 2:
                    got = [r.read(*arg) for r, arg in calls]
                else:  # at a URL every read is a request: the wave's requests in flight together
                    got = list(self._pool.map(lambda call: call[0].read(*call[1]), calls))
            finally:
                self._release(wave)
            for j, g in zip(todo, got):
                out[j] = g
        return out

    def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at `indices` (any order). Each chunk they fall in is read once (one
        request at a URL) unless it is in the LRU of decoded chunks or another thread is
        fetching it (then this read waits for that fetch); with group_size 1 the records are
        read directly, in one batch per shard. Thread-safe; the fetches of concurrent reads
        (the reader's prefetch threads) are in flight together."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_records):
            raise IndexError(f"cache {self.path!r} has {self.num_records} records; asked for {idx.min()}..{idx.max()}")
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        local = idx - self.offsets[shard]
        out: list[bytes] = [b""] * idx.size
        if self.group_size == 1 and self._ranges is None:  # a record a chunk: no LRU (format 2)
            groups = [(int(s), np.nonzero(shard == s)[0]) for s in np.unique(shard)]
            results = self._run([(s, (local[w].tolist(),)) for s, w in groups])
            with self._lock:
                self._stats["chunk_fetches"] += int(idx.size)
            for (_, where), got in zip(groups, results):
                for w, rec in zip(where.tolist(), got):
                    out[w] = rec
            return out
        g = self.group_size
        chunk = self._chunk_base[shard] + local // g
        have: dict[int, list[bytes]] = {}
        waits: dict[int, Future] = {}
        missing: list[int] = []
        with self._lock:
            for c in np.unique(chunk).tolist():
                kept = self._chunks.get(c)
                if kept is not None:
                    self._chunks.move_to_end(c)
                    have[c] = kept
                elif c in self._inflight:
                    waits[c] = self._inflight[c]
                else:
                    self._inflight[c] = Future()
                    missing.append(c)
            self._stats["chunk_hits"] += len(have) + len(waits)
            self._stats["chunk_fetches"] += len(missing)
        if missing:
            jobs = []
            for c in missing:
                s = int(np.searchsorted(self._chunk_base, c, side="right")) - 1
                k = c - int(self._chunk_base[s])
                n_s = int(self.offsets[s + 1] - self.offsets[s])
                jobs.append((s, (k * g, min((k + 1) * g, n_s))))
            try:
                fetched = self._run(jobs) if self._ranges is None else self._fetch_ranges(missing)
            except BaseException as e:
                with self._lock:
                    for c in missing:
                        self._inflight.pop(c).set_exception(e)
                raise
            have.update(zip(missing, fetched))
            with self._lock:
                self._keep(missing, have)
                for c in missing:
                    self._inflight.pop(c).set_result(have[c])
        for c, f in waits.items():
            have[c] = f.result()
        first = (chunk - self._chunk_base[shard]) * g  # the chunk's first local record
        for w, (c, at) in enumerate(zip(chunk.tolist(), (local - first).tolist())):
            out[w] = have[c][at]
        return out

    def _fetch_ranges(self, chunks: list[int]) -> list[list[bytes]]:
        """The records of `chunks` (format 4): one ranged read each, all of them in one
        `storage.read_ranges` call (at a URL in flight together), each checked and decoded."""
        assert self._ranges is not None
        shards = (np.searchsorted(self._chunk_base, chunks, side="right") - 1).tolist()
        rows = np.asarray(self._ranges[np.asarray(chunks, np.int64)]).tolist()
        blobs = storage.read_ranges([(self._files[s], o, o + n) for s, (o, n, _) in zip(shards, rows)])
        out = []
        g = self.group_size
        for c, s, (o, _, crc), blob in zip(chunks, shards, rows, blobs):
            k = c - int(self._chunk_base[s])
            count = min(g, int(self.offsets[s + 1] - self.offsets[s]) - k * g)
            try:
                out.append(decode_chunk(blob, o, crc, count))
            except ChunkError as e:
                raise CacheIntegrityError(
                    f"cache {self.path!r}: chunk {k} of {self.info['shards'][s]['file']} (bytes {o}..{o + len(blob)}): "
                    f"{e}; {verify_hint(self.path, self.info.get('task'), self.info.get('split'))}, then re-cache"
                ) from e
        return out

    def _keep(self, chunks: list[int], have: dict[int, list[bytes]]) -> None:
        """Puts the fetched `chunks` into the LRU, then drops the least recently used ones
        beyond `chunk_cache_bytes`."""
        for c in chunks:
            recs = have[c]
            self._chunks[c] = recs
            self._chunk_bytes += _chunk_size(recs)
        while self._chunk_bytes > self.chunk_cache_bytes and self._chunks:
            _, recs = self._chunks.popitem(last=False)
            self._chunk_bytes -= _chunk_size(recs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()
            self._chunks.clear()
            self._chunk_bytes = 0


def _chunk_size(records: list[bytes]) -> int:
    """The bytes a decoded chunk holds (its records and their Python objects)."""
    return sum(map(len, records)) + 64 * len(records)
