"""chunk_index: an ArrayRecord shard's chunks found by walking its headers, and each decoded
from its byte range alone, equal to what array-record's own reader returns."""

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from cairn import storage
from cairn.datatasks.deterministic import chunk_index


def _write(path, records, options):
    w = ArrayRecordWriter(str(path), options)
    for r in records:
        w.write(r)
    w.close()


@pytest.mark.parametrize(
    "options,sizes",
    [
        ("group_size:5", (0, 300)),  # short records: one-byte and two-byte size varints, zstd
        ("group_size:3", (20_000, 90_000)),  # chunks across 64 KiB block headers, incompressible
        ("group_size:4,uncompressed", (0, 40)),  # compression type 0
    ],
)
def test_chunks_read_by_range_equal_array_records_reader(tmp_path, options, sizes):
    rng = np.random.default_rng(len(options))
    records = [rng.integers(0, 256, rng.integers(*sizes), dtype=np.uint8).tobytes() for _ in range(23)]
    group = int(options.split(",")[0].split(":")[1])
    path = tmp_path / "shard.array_record"
    _write(path, records, options)
    ranges = chunk_index.chunk_ranges(str(path), len(records), group)
    assert ranges.shape == (-(-23 // group), 3) and ranges[0, 0] == 64
    assert (np.diff(ranges[:, 0]) >= ranges[:-1, 1]).all()  # ranges in order, never overlapping
    blobs = storage.read_ranges([(str(path), o, o + n) for o, n, _ in ranges.tolist()])
    got = []
    for k, ((o, _, crc), blob) in enumerate(zip(ranges.tolist(), blobs)):
        got += chunk_index.decode_chunk(blob, o, crc, min(group, 23 - k * group))
    reader = ArrayRecordReader(str(path))
    assert got == records == reader.read_all()
    reader.close()
    o, n, crc = ranges[-1].tolist()
    with pytest.raises(chunk_index.ChunkError, match="checksum mismatch"):
        chunk_index.decode_chunk(blobs[-1][:-1] + bytes([blobs[-1][-1] ^ 1]), o, crc, 23 - (len(ranges) - 1) * group)
    with pytest.raises(chunk_index.ChunkError, match="expected a simple chunk of 9 records"):
        chunk_index.decode_chunk(blobs[-1], o, crc, 9)


def test_a_file_with_fewer_or_other_chunks_than_expected_is_refused(tmp_path):
    path = tmp_path / "s.array_record"
    _write(path, [b"x"] * 10, "group_size:4")
    with pytest.raises(chunk_index.ChunkError, match="holds 4 records, expected 3"):
        chunk_index.chunk_ranges(str(path), 10, 3)
    with pytest.raises(chunk_index.ChunkError, match="holds 2 records, expected 3"):  # fewer records
        chunk_index.chunk_ranges(str(path), 11, 4)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(chunk_index.ChunkError, match="8 of 10 records found before the end of the file"):
        chunk_index.chunk_ranges(str(path), 10, 4)
    assert chunk_index.chunk_ranges(str(path), 0, 4).shape == (0, 3)
