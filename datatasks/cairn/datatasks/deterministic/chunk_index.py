"""The chunks of an ArrayRecord shard as byte ranges: found once when the shard is written,
each read later with one ranged read and decoded here, with no ArrayRecord reader open.

An ArrayRecord file is a Riegeli/records file (google/riegeli, doc/riegeli_records_file_format.md):
a 24-byte block header at every multiple of 64 KiB, a file signature chunk, then one "simple"
chunk (type `r`) of `group_size` records per ArrayRecord group, then ArrayRecord's footer
(its own chunk index) and postscript. A chunk is a 40-byte header (`data_size`, `chunk_type`,
`num_records`, `decoded_data_size`; the hashes are HighwayHash, not checked here) followed by
its data, both interrupted by block headers. A simple chunk's data is a compression byte (0:
none, `z`: zstd), the compressed record sizes (varints) and the compressed concatenated
values; each compressed block starts with its decompressed size (a varint).

`chunk_ranges` walks the chunk headers of a written shard and returns, per record chunk, its
byte offset, length and CRC-32 (stored in the cache's `chunks.npy`); `decode_chunk` checks a
range's CRC-32 and header against them and returns the records.
"""

from __future__ import annotations

import mmap
import threading
import zlib

import numpy as np

from cairn.datatasks.errors import DataTasksError

BLOCK, BLOCK_HEADER, CHUNK_HEADER = 1 << 16, 24, 40
_USABLE = BLOCK - BLOCK_HEADER
_FIRST_CHUNK = BLOCK_HEADER + CHUNK_HEADER  # after the first block header and the file signature
_SIMPLE, _TRANSPOSED = ord("r"), ord("t")
_local = threading.local()


class ChunkError(DataTasksError):
    """A chunk whose bytes do not match what the cache recorded (or that this reader cannot decode)."""


def _strip(data: bytes | memoryview, begin: int) -> bytes:
    """`data` (a file's bytes from offset `begin`) without the block headers inside it."""
    first = -(-begin // BLOCK) * BLOCK
    if first - begin >= len(data):
        return bytes(data)
    parts, at = [], 0
    for b in range(first, begin + len(data), BLOCK):
        parts.append(data[at : b - begin])
        at = b - begin + BLOCK_HEADER
    parts.append(data[at:])
    return b"".join(parts)


def _chunk_end(begin: int, data_size: int, num_records: int) -> int:
    """Where a chunk that begins at `begin` ends (the format's implementation notes)."""
    size = CHUNK_HEADER + data_size
    end = begin + size + (size + (begin + _USABLE - 1) % BLOCK) // _USABLE * BLOCK_HEADER
    pos = begin + num_records
    possible = pos + max(0, (-pos) % BLOCK - (_USABLE - 1))
    return max(end, possible)


def _header(raw: bytes) -> tuple[int, int, int, int]:
    """`(data_size, chunk_type, num_records, decoded_data_size)` of a 40-byte chunk header."""
    return (
        int.from_bytes(raw[8:16], "little"),
        raw[24],
        int.from_bytes(raw[25:32], "little"),
        int.from_bytes(raw[32:40], "little"),
    )


def chunk_ranges(path: str, num_records: int, group_size: int) -> np.ndarray:
    """`[C, 3]` int64 `(offset, length, crc32)` of each record chunk of the local ArrayRecord
    file `path`, which holds `num_records` records in chunks of `group_size` (the last may be
    shorter). Raises `ChunkError` if the file is not laid out so."""
    out: list[tuple[int, int, int]] = []
    if num_records == 0:
        return np.zeros([0, 3], np.int64)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos, seen, size = _FIRST_CHUNK, 0, len(m)
        while seen < num_records:
            if pos + CHUNK_HEADER > size:
                raise ChunkError(f"{path}: {seen} of {num_records} records found before the end of the file")
            data_size, kind, n, _ = _header(_strip(m[pos : pos + CHUNK_HEADER + 2 * BLOCK_HEADER], pos))
            end = _chunk_end(pos, data_size, n)
            if kind == _TRANSPOSED:
                raise ChunkError(f"{path}: a transposed chunk at byte {pos}; shards are written with transpose:false")
            if kind == _SIMPLE and n:
                want = min(group_size, num_records - seen)
                if n != want:
                    raise ChunkError(f"{path}: chunk at byte {pos} holds {n} records, expected {want}")
                out.append((pos, end - pos, zlib.crc32(m[pos:end])))
                seen += n
            pos = end
    return np.asarray(out, np.int64).reshape(-1, 3)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, at
        shift += 7


def _varints(data: bytes, n: int) -> np.ndarray:
    """`n` varint64s packed in `data` (all of it), as int64."""
    b = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != n or (n and ends[-1] != b.size - 1):
        raise ChunkError(f"record sizes hold {ends.size} varints, expected {n}")
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    if n == 0 or int((ends - starts).max()) == 0:
        return b[ends].astype(np.int64)
    group = np.repeat(np.arange(n), ends - starts + 1)
    shift = (np.arange(b.size) - starts[group]) * 7
    return np.add.reduceat((b & 0x7F).astype(np.int64) << shift, starts)


def _decompress(kind: int, block: bytes) -> bytes:
    if kind == 0:
        return block
    size, at = _varint(block, 0)
    if kind == ord("z"):
        import zstandard

        d = getattr(_local, "zstd", None)
        if d is None:
            d = _local.zstd = zstandard.ZstdDecompressor()
        out = d.decompress(block[at:], max_output_size=size)
    else:
        raise ChunkError(f"compression {chr(kind)!r} is not supported (shards are written with zstd)")
    if len(out) != size:
        raise ChunkError(f"a compressed block decoded to {len(out)} bytes, its header says {size}")
    return out


def decode_chunk(data: bytes, begin: int, crc32: int, num_records: int) -> list[bytes]:
    """The records of the chunk whose bytes `data` were read from offset `begin` of its shard.
    Raises `ChunkError` unless their CRC-32 is `crc32` and the chunk holds `num_records`."""
    got = zlib.crc32(data)
    if got != int(crc32):
        raise ChunkError(f"checksum mismatch (CRC-32 {got:08x}, recorded {int(crc32):08x})")
    raw = _strip(data, begin)
    data_size, kind, n, decoded = _header(raw)
    if kind != _SIMPLE or n != num_records or len(raw) < CHUNK_HEADER + data_size:
        raise ChunkError(
            f"chunk type {chr(kind)!r} with {n} records in {len(raw)} bytes, expected a simple chunk of "
            f"{num_records} records and {CHUNK_HEADER + data_size} bytes"
        )
    body = raw[CHUNK_HEADER : CHUNK_HEADER + data_size]
    sizes_len, at = _varint(body, 1)
    sizes = _varints(_decompress(body[0], body[at : at + sizes_len]), n)
    values = _decompress(body[0], body[at + sizes_len :])
    ends = np.cumsum(sizes)
    if (int(ends[-1]) if n else 0) != len(values) or len(values) != decoded:
        raise ChunkError(f"record sizes add up to {int(ends[-1]) if n else 0} bytes, the values hold {len(values)}")
    starts = (ends - sizes).tolist()
    return [values[a:b] for a, b in zip(starts, ends.tolist())]
