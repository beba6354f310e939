"""The abstract `Vocabulary`: ids <-> text in Python and in TensorFlow, with seqio's semantics.

Id conventions (as in seqio and T5): PAD is always 0; `eos_id` and `unk_id` are set by
each vocabulary; `extra_ids` sentinels sit at the top of the id space.

Decoding rules, shared by every vocabulary and by `decode` and `decode_tf` alike:
  1. an id outside `[0, _base_vocab_size)` (negative ids included) becomes `unk_id`
     when the vocabulary has one (seqio maps only ids >= the base size; we also map
     negative ids, which seqio passes on and SentencePiece rejects with a crash);
  2. everything after the first EOS is dropped (the EOS itself is kept and is then
     rendered as nothing).
Empty input encodes to `[]` and decodes to `""`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import numpy as np

PAD_ID = 0


class VocabularyError(ValueError):
    """A vocabulary could not be loaded or was given input it cannot handle."""


def _tf():
    import tensorflow as tf  # Lazy: `import cairn.tokenizers` must not load TensorFlow.

    return tf


def as_input(s: str | bytes) -> str | bytes:
    """`s` for an encoder that takes raw bytes: `str` as it is, bytes-like as `bytes`, never
    decoded (the invalid-UTF-8 policy: the vocabulary encodes the raw bytes, as seqio does;
    SentencePiece gives its unknown id for each invalid byte, bytes vocabularies keep them)."""
    if isinstance(s, str):
        return s
    if isinstance(s, (bytes, bytearray, np.bytes_)):
        return bytes(s)
    raise TypeError(f"expected str or bytes to encode, got {type(s).__name__}")


def as_text(s: str | bytes) -> str:
    """Returns `s` as `str`; invalid UTF-8 bytes become U+FFFD (documented policy)."""
    if isinstance(s, str):
        return s
    if isinstance(s, (bytes, bytearray, np.bytes_)):
        return bytes(s).decode("utf-8", errors="replace")
    raise TypeError(f"expected str or bytes to encode, got {type(s).__name__}")


def as_id_list(ids: Iterable[Any]) -> list[int]:
    """Converts a list, tuple, numpy array or eager tensor of ids to a list of ints."""
    if hasattr(ids, "numpy") and not isinstance(ids, np.ndarray):
        ids = ids.numpy()
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise VocabularyError(f"decode expects a 1-D sequence of ids, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise VocabularyError(f"decode expects integer ids, got dtype {ids.dtype}")
        return ids.tolist()
    out = []
    for i in ids:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise VocabularyError(f"decode expects integer ids, got {i!r}")
        out.append(int(i))
    return out


class Vocabulary(metaclass=abc.ABCMeta):
    """Maps text to ids and back; see the module docstring for the shared rules."""

    def __init__(self, extra_ids: int = 0):
        if not isinstance(extra_ids, int) or extra_ids < 0:
            raise VocabularyError(f"extra_ids must be a non-negative int, got {extra_ids!r}")
        self._extra_ids = extra_ids

    # -- ids -------------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    @abc.abstractmethod
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None."""

    @property
    @abc.abstractmethod
    def unk_id(self) -> int | None:
        """The unknown-token id, or None."""

    @property
    def extra_ids(self) -> int:
        return self._extra_ids

    @property
    @abc.abstractmethod
    def _base_vocab_size(self) -> int:
        """Ids that decode to text (PAD/EOS/UNK included); larger ids decode as UNK."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, extra ids included (the model's embedding size)."""
        return self._base_vocab_size + self._extra_ids

    # -- python ----------------------------------------------------------------------
    @abc.abstractmethod
    def _encode(self, s: Any) -> list[int]: ...

    @abc.abstractmethod
    def _decode(self, ids: list[int]) -> Any: ...

    def encode(self, s: Any) -> list[int]:
        """Text to ids, without EOS."""
        return self._encode(s)

    def clean_ids(self, ids: Iterable[Any]) -> list[int]:
        """Applies the shared decoding rules (out of range -> UNK, cut after EOS)."""
        clean = as_id_list(ids)
        if self.unk_id is not None:
            size, unk = self._base_vocab_size, self.unk_id
            clean = [i if 0 <= i < size else unk for i in clean]
        if self.eos_id is not None and self.eos_id in clean:
            clean = clean[: clean.index(self.eos_id) + 1]
        return clean

    def decode(self, ids: Iterable[Any]) -> Any:
        """Ids to text, up to and including the first EOS."""
        return self._decode(self.clean_ids(ids))

    # -- tensorflow ------------------------------------------------------------------
    @abc.abstractmethod
    def _encode_tf(self, s): ...

    @abc.abstractmethod
    def _decode_tf(self, ids): ...

    def encode_tf(self, s):
        """Text tensor to ids: a scalar gives a 1-D int32 tensor, a batch a RaggedTensor."""
        return self._encode_tf(s)

    def clean_ids_tf(self, ids):
        """The TensorFlow twin of `clean_ids`: ids after the first EOS become PAD."""
        tf = _tf()
        if isinstance(ids, tf.RaggedTensor):
            dense = self.clean_ids_tf(ids.to_tensor(default_value=self.pad_id))
            return tf.RaggedTensor.from_tensor(dense, lengths=ids.nested_row_lengths())
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        if self.unk_id is not None:
            in_range = tf.logical_and(ids >= 0, ids < self._base_vocab_size)
            ids = tf.where(in_range, ids, self.unk_id)
        if self.eos_id is not None:
            seen = tf.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32), axis=-1, exclusive=True)
            ids = tf.where(seen > 0, self.pad_id, ids)
        return ids

    def decode_tf(self, ids):
        """Id tensor (dense or ragged, any rank >= 1) to a string tensor of rank - 1."""
        return self._decode_tf(self.clean_ids_tf(ids))

    # -- identity --------------------------------------------------------------------
    @abc.abstractmethod
    def _content_key(self) -> tuple:
        """What defines this vocabulary; equality and hashing use it."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary) or type(self) is not type(other):
            return False
        return self._content_key() == other._content_key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._content_key()))
