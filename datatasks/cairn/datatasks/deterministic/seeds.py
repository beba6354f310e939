"""Seed derivation for the deterministic pipeline: hashlib over explicit parts, never hash()."""

from __future__ import annotations

import hashlib
import struct


def derive(*parts: int | str) -> int:
    """A 63-bit integer from `parts` (ints and strings), stable across runs and machines."""
    h = hashlib.blake2b(digest_size=8, person=b"cairn-det")
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, (int, str)):
            raise TypeError(f"seed parts must be int or str, got {type(p).__name__}: {p!r}")
        data = p.encode("utf-8") if isinstance(p, str) else str(int(p)).encode("ascii")
        h.update(b"s" if isinstance(p, str) else b"i")
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return int.from_bytes(h.digest(), "little") >> 1


def record_key(seed: int, task: str, epoch: int, record: int) -> tuple[int, int]:
    """The `[2]` stateless key of one record's post-cache preprocessing in one epoch."""
    return derive(seed, task, "record", epoch), int(record)
