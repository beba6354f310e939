"""The few bytes of SentencePiece's ModelProto that a vocabulary needs to append.

Protobuf parsers concatenate repeated fields in the order met and merge repeated
occurrences of a singular message, so sentinels and normalizer overrides can be appended
to a serialized model without a generated `_pb2` module (sentencepiece's own needs a
newer protobuf runtime than TensorFlow and Apache Beam accept).

ModelProto: pieces = 1 (repeated SentencePiece), normalizer_spec = 3,
denormalizer_spec = 5. SentencePiece: piece = 1, score = 2 (float), type = 3
(USER_DEFINED = 4). NormalizerSpec: name = 1, add_dummy_prefix = 3,
remove_extra_whitespaces = 4, escape_whitespaces = 5, normalization_rule_tsv = 6.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

_USER_DEFINED = 4
NORMALIZER_FIELDS = {
    "name": (1, str),
    "add_dummy_prefix": (3, bool),
    "remove_extra_whitespaces": (4, bool),
    "escape_whitespaces": (5, bool),
    "normalization_rule_tsv": (6, str),
}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _varint_field(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def user_defined_piece(piece: str) -> bytes:
    """One `pieces` entry: a USER_DEFINED piece with score 0."""
    body = (
        _length_delimited(1, piece.encode("utf-8"))
        + _varint(2 << 3 | 5)
        + struct.pack("<f", 0.0)
        + _varint_field(3, _USER_DEFINED)
    )
    return _length_delimited(1, body)


def normalizer_overrides(overrides: Mapping[str, Any]) -> bytes:
    """Fields merged into both the normalizer and the denormalizer spec (as seqio does)."""
    body = b""
    for key in sorted(overrides):
        if key not in NORMALIZER_FIELDS:
            raise KeyError(key)
        number, kind = NORMALIZER_FIELDS[key]
        value = overrides[key]
        if kind is bool:
            body += _varint_field(number, int(bool(value)))
        else:
            body += _length_delimited(number, str(value).encode("utf-8"))
    return _length_delimited(3, body) + _length_delimited(5, body) if body else b""
