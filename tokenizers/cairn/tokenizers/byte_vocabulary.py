"""`ByteVocabulary`: ByT5's vocabulary of UTF-8 bytes.

Ids: 0 PAD, 1 EOS, 2 UNK, then byte `b` is id `b + 3` (259 ids), then `extra_ids`
sentinels. Decoding drops PAD/EOS/UNK and sentinels and ignores invalid UTF-8 sequences,
as ByT5 and seqio do. Encoding `bytes` keeps them as they are (even invalid UTF-8).
"""

from __future__ import annotations

import numpy as np

from cairn.tokenizers.vocabulary import Vocabulary, _tf

_SPECIAL = 3
_BYTES = 256


class ByteVocabulary(Vocabulary):
    """UTF-8 bytes as ids (ByT5)."""

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def unk_id(self) -> int:
        return 2

    @property
    def _base_vocab_size(self) -> int:
        return _SPECIAL + _BYTES

    def _content_key(self) -> tuple:
        return (self._extra_ids,)

    def __repr__(self) -> str:
        return f"ByteVocabulary(extra_ids={self._extra_ids})"

    def _encode(self, s: str | bytes) -> list[int]:
        data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        return (np.frombuffer(data, dtype=np.uint8).astype(np.int32) + _SPECIAL).tolist()

    def _decode(self, ids: list[int]) -> str:
        data = bytes(i - _SPECIAL for i in ids if _SPECIAL <= i < _SPECIAL + _BYTES)
        return data.decode("utf-8", errors="ignore")

    def _encode_tf(self, s):
        tf = _tf()
        s = tf.convert_to_tensor(s, dtype=tf.string)
        if s.shape.rank == 0:
            return tf.cast(tf.io.decode_raw(s, tf.uint8), tf.int32) + _SPECIAL
        chars = tf.strings.bytes_split(s)  # ragged: one single-byte string per byte

        def to_ids(v):
            return tf.cast(tf.reshape(tf.io.decode_raw(v, tf.uint8), [-1]), tf.int32) + _SPECIAL

        return tf.ragged.map_flat_values(to_ids, chars)

    def _decode_tf(self, ids):
        tf = _tf()
        keep = tf.logical_and(ids >= _SPECIAL, ids < _SPECIAL + _BYTES)
        kept = tf.ragged.boolean_mask(ids, keep) - _SPECIAL
        table = tf.constant([bytes([b]) for b in range(_BYTES)])
        joined = tf.strings.reduce_join(tf.gather(table, kept), axis=-1)
        return tf.strings.unicode_transcode(joined, input_encoding="UTF-8", output_encoding="UTF-8", errors="ignore")
