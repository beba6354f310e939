"""`NumpyFunctionOps`: a vocabulary's TensorFlow ops as `tf.numpy_function` over its Python code.

For vocabularies backed by a native library (SentencePiece, Hugging Face `tokenizers`): the
ops run the very code of `encode`/`decode`, so both paths give equal results, and
`stateful=False` keeps `tf.data` iterators checkpointable. A subclass provides `_encode(s)`,
`_encode_many(texts)` (a list of `bytes`: the batch path) and `_decode(ids)`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from cairn.tokenizers.vocabulary import VocabularyError, _tf


class NumpyFunctionOps:
    """Mixin for a `Vocabulary`: `_encode_tf` and `_decode_tf` through `tf.numpy_function`."""

    # Provided by the vocabulary (annotations only: `Vocabulary`'s abstract methods stay abstract).
    pad_id: int
    _encode: Callable[[Any], list[int]]
    _encode_many: Callable[[list[bytes]], list[list[int]]]
    _decode: Callable[[list[int]], Any]

    def _np_encode_one(self, s: Any) -> np.ndarray:
        return np.asarray(self._encode(s.item() if isinstance(s, np.ndarray) else s), dtype=np.int32)

    def _np_encode_many(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = self._encode_many(list(flat))
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
        return values, lengths

    def _np_decode_rows(self, rows: np.ndarray) -> np.ndarray:
        flat = rows.reshape(-1, rows.shape[-1])
        out = [self._decode(r.tolist()).encode("utf-8") for r in flat]
        return np.asarray(out, dtype=object).reshape(rows.shape[:-1])

    def _encode_tf(self, s):
        tf = _tf()
        s = tf.convert_to_tensor(s, dtype=tf.string)
        rank = s.shape.rank
        if rank is None:
            raise VocabularyError("encode_tf needs a string tensor of known rank")
        if rank == 0:
            ids = tf.numpy_function(self._np_encode_one, [s], tf.int32, stateful=False)
            ids.set_shape([None])
            return ids
        outer = tf.shape(s, out_type=tf.int64)
        values, lengths = tf.numpy_function(
            self._np_encode_many, [tf.reshape(s, [-1])], [tf.int32, tf.int64], stateful=False
        )
        values.set_shape([None])
        lengths.set_shape([None])
        rt = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
        for axis in range(rank - 1, 0, -1):
            rt = tf.RaggedTensor.from_uniform_row_length(rt, outer[axis], validate=False)
        return rt

    def _decode_tf(self, ids):
        """Dense rows (ragged ones padded with PAD first): a string tensor of rank - 1."""
        tf = _tf()
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=self.pad_id)
        if ids.shape.rank is None or ids.shape.rank < 1:
            raise VocabularyError("decode_tf needs an id tensor of rank >= 1")
        out = tf.numpy_function(self._np_decode_rows, [ids], tf.string, stateful=False)
        out.set_shape(ids.shape[:-1])
        return out
