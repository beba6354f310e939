"""Source files at a URL (`gs://`, `s3://`, `file://`), listed and read through `cairn.storage`.

tf.data's file readers reach `gs://` through TensorFlow's own GCS client, which has no endpoint
override (no emulator, so nothing on it can be tested). File sources whose files are at a URL
list and read them here instead, through fsspec (gcsfs), which `STORAGE_EMULATOR_HOST` covers:

* `glob(pattern)`: the files (never "directories") matching a URL pattern, as URLs;
* `iter_lines(f)`: a file's lines exactly as `tf.data.TextLineDataset` splits them;
* `iter_tfrecords(f, name)`: a TFRecord file's records, each length and payload checked
  against its masked CRC-32C as `tf.data.TFRecordDataset` does (a mismatch or a truncated
  record is a `CorruptSourceError` naming the file and the offset).

No TensorFlow here: `sources` wraps these generators in tf.data (`records_dataset`).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable, Iterator
from typing import IO, Any

from cairn import storage
from cairn.datatasks.errors import DataTasksError

BLOCK = 1 << 20  # bytes read per request from a file (the client buffers ahead as well)
BATCH = 1024  # records handed to tf.data per call (one Python call per batch, not per record)


class CorruptSourceError(DataTasksError):
    """A source file whose bytes do not frame into records (a bad CRC, a truncated record)."""


# The `CorruptSourceError`s raised in this process by readers that tf.data ran (`reporting`):
# tf.data hands an exception raised in a generator on as an `InvalidArgumentError` holding its
# traceback; the cache writer raises the error itself instead (`pop_raised`).
_RAISED: list[CorruptSourceError] = []


def reporting(records: Iterator[Any]) -> Iterator[Any]:
    """`records`, a `CorruptSourceError` they raise also kept for `pop_raised`."""
    try:
        yield from records
    except CorruptSourceError as e:
        _RAISED.append(e)
        raise


def pop_raised() -> CorruptSourceError | None:
    """The first `CorruptSourceError` a reader raised since the last call (None: none); forgets them."""
    first = _RAISED[0] if _RAISED else None
    _RAISED.clear()
    return first


def glob(pattern: str) -> list[str]:
    """The files matching a URL `pattern` (fsspec's glob: `*` stays within one `/` level, dot
    files match), as URLs with the pattern's scheme, sorted. A missing bucket matches nothing."""
    fs, inner = storage.filesystem(pattern)
    prefix = pattern[: pattern.index("://") + 3]
    try:
        found = fs.glob(inner, detail=True)
    except FileNotFoundError:
        return []
    return sorted(prefix + name for name, entry in found.items() if entry.get("type") == "file")


def open_binary(path: str) -> IO[bytes]:
    """A binary file object of `path` (ranged reads at a URL)."""
    if not storage.is_url(path):
        return open(path, "rb")
    fs, inner = storage.filesystem(path)
    return fs.open(inner, "rb")


def is_dir(path: str) -> bool:
    """Whether `path` is a directory (at a URL: a prefix holding objects)."""
    if not storage.is_url(path):
        return os.path.isdir(path)
    fs, inner = storage.filesystem(path)
    return bool(fs.isdir(inner))


def exists(path: str) -> bool:
    if not storage.is_url(path):
        return os.path.exists(path)
    fs, inner = storage.filesystem(path)
    return bool(fs.exists(inner))


def list_dir(path: str) -> list[str]:
    """The names (not paths) directly in the directory `path`, sorted."""
    if not storage.is_url(path):
        return sorted(os.listdir(path))
    fs, inner = storage.filesystem(path)
    return sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(inner, detail=False))


def iter_lines(f: IO[bytes]) -> Iterator[bytes]:
    """The lines of `f` as `tf.data.TextLineDataset` gives them: split at `\\n` only, every
    `\\r` dropped, a last line without `\\n` kept, nothing after a final `\\n`."""
    tail = b""
    while True:
        block = f.read(BLOCK)
        if not block:
            break
        parts = (tail + block.replace(b"\r", b"")).split(b"\n")
        tail = parts.pop()
        yield from parts
    if tail:
        yield tail


def _crc32c() -> Callable[[bytes], int]:
    import google_crc32c  # gcsfs's own checksum library (C, or its pure-Python fallback)

    return google_crc32c.value


def masked_crc(data: bytes, crc32c: Callable[[bytes], int] | None = None) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = (crc32c or _crc32c())(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _Blocks:
    """`read(n)`: exactly `n` bytes of `f` (fewer at its end), fetched `BLOCK` bytes per
    request (a remote file object may send a request per small read)."""

    def __init__(self, f: IO[bytes]):
        self._f, self._buf, self._pos = f, b"", 0

    def read(self, n: int) -> bytes:
        if self._pos + n > len(self._buf):
            parts, have = [self._buf[self._pos :]], len(self._buf) - self._pos
            while have < n:
                block = self._f.read(max(BLOCK, n - have))
                if not block:
                    break
                parts.append(block)
                have += len(block)
            self._buf, self._pos = b"".join(parts), 0
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out


def iter_tfrecords(f: IO[bytes], name: str) -> Iterator[bytes]:
    """The records of the TFRecord file `f` (`name` for errors). Each record is framed as
    `uint64 length, uint32 masked_crc(length), data, uint32 masked_crc(data)` (little-endian);
    both CRCs are checked."""
    crc32c = _crc32c()
    blocks = _Blocks(f)
    offset = 0
    while True:
        header = blocks.read(12)
        if not header:
            return
        if len(header) < 12:
            raise CorruptSourceError(f"TFRecord file {name}: truncated record header at byte {offset}")
        (length,) = struct.unpack("<Q", header[:8])
        (want,) = struct.unpack("<I", header[8:])
        if masked_crc(header[:8], crc32c) != want:
            raise CorruptSourceError(f"TFRecord file {name}: corrupted record length at byte {offset} (CRC mismatch)")
        body = blocks.read(length + 4)
        if len(body) < length + 4:
            raise CorruptSourceError(
                f"TFRecord file {name}: truncated record at byte {offset} ({length} bytes announced)"
            )
        data = body[:length]
        if masked_crc(data, crc32c) != struct.unpack("<I", body[length:])[0]:
            raise CorruptSourceError(f"TFRecord file {name}: corrupted record at byte {offset} (CRC mismatch)")
        yield data
        offset += 16 + length


FORMATS: dict[str, Callable[[IO[bytes], str], Iterator[bytes]]] = {
    "lines": lambda f, name: iter_lines(f),
    "tfrecord": iter_tfrecords,
}


def batches(path: str, file_format: str, size: int = BATCH) -> Iterator[list[bytes]]:
    """The records of the file at `path` in `file_format` (`FORMATS`), `size` at a time."""
    with open_binary(path) as f:
        records = reporting(FORMATS[file_format](f, path))
        while batch := list(itertools.islice(records, size)):
            yield batch
