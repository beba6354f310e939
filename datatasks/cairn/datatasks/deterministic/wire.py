"""Cached records decoded with NumPy: `tf.train.Example` wire format, no TensorFlow.

A cache holds one `tf.train.Example` per record, written by `records.serialize`: every
record has the same features (one map entry each, in the serializer's order), numbers in
packed lists. `decode` walks the entries of all records at once: each length-delimited
header is a vectorised varint read at one position per record, each entry's name is
matched against the cache's feature names, and each wanted feature's payload (packed
varints, or packed little-endian floats) is decoded in one pass over the batch. A record
that does not have the expected layout raises `WireFormatError` (the reader then uses the
TensorFlow parser).

Wire format (protobuf): a field's tag is `number << 3 | wire_type` (2: length-delimited);
Example{1: Features{1: map entry{1: key, 2: Feature{1: BytesList | 2: FloatList |
3: Int64List{1: packed values}}}}}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.deterministic.records import FeatureSpec
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.ragged import Ragged

_LIST_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}
_SHIFTS = (7 * np.arange(10, dtype=np.uint64)).astype(np.uint64)


class WireFormatError(DataTasksError):
    """A record is not laid out as `records.serialize` writes them."""


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint at each of `pos` in `buf` (padded with 10 zero bytes): (values, next positions)."""
    b0 = buf[pos]
    if (b0 < 0x80).all():  # one byte each: the common case of short headers
        return b0.astype(np.int64), pos + 1
    b1 = buf[pos + 1].astype(np.int64)
    if ((b0 < 0x80) | (b1 < 0x80)).all():
        two = b0 >= 0x80
        return (b0 & 0x7F).astype(np.int64) + np.where(two, b1 << 7, 0), pos + 1 + two
    b = buf[pos[:, None] + np.arange(10)]
    ends = b < 0x80
    n = ends.argmax(1) + 1
    if not ends.any(1).all():
        raise WireFormatError("malformed varint in a cached record")
    parts = (b.astype(np.uint64) & np.uint64(0x7F)) << _SHIFTS
    parts[np.arange(10)[None, :] >= n[:, None]] = 0
    return np.bitwise_or.reduce(parts, axis=1).view(np.int64), pos + n


def _expect(buf: np.ndarray, pos: np.ndarray, tag: int, what: str) -> np.ndarray:
    if pos.size and not (buf[pos] == tag).all():
        raise WireFormatError(f"cached record: expected {what}")
    return pos + 1


def _gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes `buf[starts[i]:starts[i] + lengths[i]]` of every i, concatenated."""
    total = int(lengths.sum())
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return buf[idx]


def decode_packed_varints(data: np.ndarray, lengths: np.ndarray) -> Ragged:
    """Packed varint payloads (concatenated, `lengths` bytes each) -> int64 `Ragged`."""
    if data.size == 0:
        return Ragged(np.zeros(0, np.int64), np.zeros(lengths.size, np.int64))
    is_end = data < 0x80
    if not is_end[-1]:
        raise WireFormatError("truncated packed varints in a cached record")
    ends = np.flatnonzero(is_end)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = ends - starts + 1
    values = (data[starts] & 0x7F).astype(np.uint64)
    for j in range(1, int(sizes.max())):  # byte j of the varints that long (1-2 for token ids)
        more = np.flatnonzero(sizes > j)
        values[more] |= (data[starts[more] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    values = values.view(np.int64)
    counts_before = np.zeros(data.size + 1, np.int64)
    np.cumsum(is_end, out=counts_before[1:])
    bounds = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return Ragged(values, np.diff(counts_before[bounds]))


def _same_key(buf: np.ndarray, pos: np.ndarray, key_len: np.ndarray, end: np.ndarray, raw: bytes) -> np.ndarray:
    """Whether the key at `pos` (of length `key_len`, inside `end`) is `raw`, per record."""
    ok = (key_len == len(raw)) & (pos + len(raw) <= end)
    if ok.all():
        return (buf[pos[:, None] + np.arange(len(raw))] == np.frombuffer(raw, np.uint8)).all(1)
    which = np.flatnonzero(ok)
    ok[which] = (buf[pos[which, None] + np.arange(len(raw))] == np.frombuffer(raw, np.uint8)).all(1)
    return ok


def _feature_payload(
    buf: np.ndarray,
    pos: np.ndarray,
    entry_end: np.ndarray,
    name: str,
    spec: FeatureSpec,
    starts: np.ndarray,
    sizes: np.ndarray,
    which: np.ndarray,
) -> None:
    """Finds the packed payload of feature `name` in the map entries of records `which`
    (`pos`: just after the key) and writes its start and size into `starts`/`sizes`."""
    if spec.kind == "bytes":
        raise WireFormatError(f"feature {name!r} holds bytes; the NumPy path reads numbers only")
    pos = _expect(buf, pos, 0x12, "a Feature")
    _, pos = _varints(buf, pos)
    pos = _expect(buf, pos, _LIST_TAG[spec.kind], f"a {spec.kind} list")
    list_len, pos = _varints(buf, pos)
    if not np.array_equal(pos + list_len, entry_end):
        raise WireFormatError(f"cached record: feature {name!r} has fields after its list")
    payload = np.zeros(which.size, np.int64)
    has = list_len > 0
    if has.any():
        p = _expect(buf, pos[has], 0x0A, f"packed values of {name!r}")
        payload[has], p = _varints(buf, p)
        if not np.array_equal(p + payload[has], entry_end[has]):
            raise WireFormatError(f"cached record: feature {name!r} has fields after its values")
    if spec.kind == "float" and (payload % 4).any():
        raise WireFormatError(f"feature {name!r}: packed floats not a multiple of 4 bytes")
    starts[which] = entry_end - payload
    sizes[which] = payload


def decode(records: Sequence[bytes], specs: Mapping[str, FeatureSpec], keys: Sequence[str]) -> dict[str, Ragged]:
    """`{key: Ragged}` of the numeric features `keys` of `records` (cached dtype; a rank-0
    feature gives one value per record). Raises `WireFormatError` on another layout."""
    missing = [k for k in keys if k not in specs]
    if missing:
        raise DataTasksError(f"the cache has no feature {missing}; it has {sorted(specs)}")
    n = len(records)
    lengths = np.array(list(map(len, records)), np.int64)
    buf = np.frombuffer(b"".join(records) + bytes(10), np.uint8)
    pos = np.zeros(n, np.int64)
    np.cumsum(lengths[:-1], out=pos[1:])
    rec_end = pos + lengths
    out: dict[str, Ragged] = {}
    if n == 0:
        return {k: Ragged(np.zeros(0, specs[k].dtype), np.zeros(0, np.int64)) for k in keys}
    pos = _expect(buf, pos, 0x0A, "Example.features")
    size, pos = _varints(buf, pos)
    if not np.array_equal(pos + size, rec_end):
        raise WireFormatError("cached record: Example.features does not fill the record")
    wanted = sorted(set(keys))
    starts = {k: np.full(n, -1, np.int64) for k in wanted}  # payload start per record
    sizes = {k: np.zeros(n, np.int64) for k in wanted}
    names = sorted(specs)
    raws = [name.encode() for name in names]
    by_raw = dict(zip(raws, names))
    for _ in names:  # one map entry per feature; their order is the serializer's
        pos = _expect(buf, pos, 0x0A, "a feature map entry")
        size, pos = _varints(buf, pos)
        entry_end = pos + size
        pos = _expect(buf, pos, 0x0A, "a feature name")
        key_len, pos = _varints(buf, pos)
        first = bytes(buf[pos[0] : pos[0] + key_len[0]])
        if first in by_raw:  # usually every record has the same feature in this entry
            raw = first
            keys_here = [(by_raw[raw], raw, _same_key(buf, pos, key_len, entry_end, raw))]
            if not keys_here[0][2].all():
                keys_here = [(name, r, _same_key(buf, pos, key_len, entry_end, r)) for name, r in zip(names, raws)]
        else:
            keys_here = [(name, r, _same_key(buf, pos, key_len, entry_end, r)) for name, r in zip(names, raws)]
        found = np.zeros(n, bool)
        for name, raw, same in keys_here:
            which = np.flatnonzero(same)
            if which.size == 0:
                continue
            found[which] = True
            if name in starts:
                p, end = pos[which] + len(raw), entry_end[which]
                _feature_payload(buf, p, end, name, specs[name], starts[name], sizes[name], which)
        if not found.all():
            raise WireFormatError("cached record: a feature the cache's info.json does not name")
        pos = entry_end
    for k in wanted:
        if (starts[k] < 0).any():
            raise WireFormatError(f"cached record without feature {k!r}")
        data = _gather(buf, starts[k], sizes[k])
        if specs[k].kind == "float":
            r = Ragged(data.view("<f4").astype(specs[k].dtype), sizes[k] // 4)
        else:
            r = decode_packed_varints(data, sizes[k])
            r = Ragged(r.values.astype(specs[k].dtype), r.lengths)
        out[k] = r
    if not np.array_equal(pos, rec_end):
        raise WireFormatError("cached record: unexpected fields after the features")
    return out
