"""`PassThroughVocabulary`: the ids are the tokens (for pre-tokenized data)."""

from __future__ import annotations

from collections.abc import Iterable

from cairn.tokenizers.vocabulary import Vocabulary, VocabularyError, _tf, as_id_list


class PassThroughVocabulary(Vocabulary):
    """Ids in, the same ids out.

    Args:
      size: number of ids; `encode` rejects ids outside `[0, size)`.
      eos_id: the end-of-sequence id, or None; `decode` cuts after the first one.
    """

    def __init__(self, size: int, eos_id: int | None = None):
        super().__init__(0)
        if not isinstance(size, int) or size <= 0:
            raise VocabularyError(f"PassThroughVocabulary size must be a positive int, got {size!r}")
        if eos_id is not None and not 0 <= eos_id < size:
            raise VocabularyError(f"eos_id {eos_id} is outside [0, {size})")
        self._size = size
        self._eos_id = eos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def unk_id(self) -> None:
        return None

    @property
    def _base_vocab_size(self) -> int:
        return self._size

    def _content_key(self) -> tuple:
        return (self._size, self._eos_id)

    def __repr__(self) -> str:
        return f"PassThroughVocabulary(size={self._size}, eos_id={self._eos_id})"

    def _encode(self, s: Iterable[int]) -> list[int]:
        if isinstance(s, (str, bytes)):
            raise VocabularyError("PassThroughVocabulary encodes sequences of ids, not text")
        ids = as_id_list(s)
        bad = [i for i in ids if not 0 <= i < self._size]
        if bad:
            raise VocabularyError(f"ids outside [0, {self._size}): {bad[:5]}")
        return ids

    def _decode(self, ids: list[int]) -> list[int]:
        return ids

    def _encode_tf(self, s):
        tf = _tf()
        return s if isinstance(s, tf.RaggedTensor) else tf.cast(tf.convert_to_tensor(s), tf.int32)

    def _decode_tf(self, ids):
        return ids
