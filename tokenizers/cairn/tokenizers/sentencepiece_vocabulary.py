"""`SentencePieceVocabulary`: a SentencePiece model with T5's sentinel layout.

With `extra_ids=n`, the pieces `<extra_id_{n-1}>` ... `<extra_id_0>` are appended to the
model as user-defined pieces, so `<extra_id_0>` has the highest id (`vocab_size - 1`), as
in T5 and seqio, and the sentinel text encodes to its id. `vocab_size` counts them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from typing import Any

import sentencepiece as spm

from cairn.tokenizers import _proto
from cairn.tokenizers.numpy_tf import NumpyFunctionOps
from cairn.tokenizers.vocabulary import Vocabulary, VocabularyError, as_input

# SentencePieceProcessor.LoadFromSerializedProto is not thread-safe.
_LOAD_LOCK = threading.Lock()


def _read_model_file(path: str) -> bytes:
    if "://" in path:  # gs://, s3:// ...: through cairn.storage (fsspec), imported only here.
        from cairn import storage

        try:
            return storage.read_bytes(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"SentencePiece model not found: {path}") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    if os.path.isdir(path):
        raise VocabularyError(f"SentencePiece model path is a directory, not a .model file: {path}")
    with open(path, "rb") as f:
        return f.read()


def _build_model(
    raw: bytes, path: str, extra_ids: int, reverse_extra_ids: bool, normalizer_spec_overrides: Mapping[str, Any] | None
) -> bytes:
    """Appends the sentinels and normalizer overrides to a serialized model."""
    order = reversed(range(extra_ids)) if reverse_extra_ids else range(extra_ids)
    extra = b"".join(_proto.user_defined_piece(f"\u2581<extra_id_{i}>") for i in order)
    try:
        extra += _proto.normalizer_overrides(normalizer_spec_overrides or {})
    except KeyError as e:
        raise VocabularyError(
            f"unknown normalizer_spec field {e.args[0]!r} for {path}; known: {sorted(_proto.NORMALIZER_FIELDS)}"
        ) from None
    return raw + extra


class SentencePieceVocabulary(NumpyFunctionOps, Vocabulary):
    """A SentencePiece model (`.model` file) as a `Vocabulary`.

    Args:
      path: the `.model` file (local, or a URL such as `gs://bucket/spm.model`, read through
            `cairn.storage`).
      extra_ids: number of sentinels `<extra_id_i>` to add at the top of the id space.
      reverse_extra_ids: if True (T5's layout), `<extra_id_0>` gets the highest id.
      normalizer_spec_overrides: NormalizerSpec fields to override, e.g.
        `{"add_dummy_prefix": False}`.

    Raises:
      FileNotFoundError: the file does not exist (the message names it).
      VocabularyError: the file is not a SentencePiece model.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        extra_ids: int = 0,
        *,
        reverse_extra_ids: bool = True,
        normalizer_spec_overrides: Mapping[str, Any] | None = None,
    ):
        super().__init__(extra_ids)
        self._path = os.fspath(path)
        self._reverse_extra_ids = reverse_extra_ids
        self._overrides = dict(normalizer_spec_overrides or {})
        self._load(_read_model_file(self._path))

    def _load(self, raw: bytes) -> None:
        self._raw = raw
        self._sp_model = _build_model(raw, self._path, self._extra_ids, self._reverse_extra_ids, self._overrides)
        sp = spm.SentencePieceProcessor()
        with _LOAD_LOCK:
            try:
                sp.LoadFromSerializedProto(self._sp_model)
            except Exception as e:  # sentencepiece raises RuntimeError on a bad proto
                raise VocabularyError(f"not a SentencePiece model (corrupt or wrong file): {self._path}: {e}") from None
        if sp.GetPieceSize() <= self._extra_ids:
            raise VocabularyError(f"not a SentencePiece model (it has no pieces): {self._path}")
        self._sp = sp
        self._digest = hashlib.sha256(self._sp_model).hexdigest()

    # -- pickling: the model travels with the object, so no file is needed to unpickle.
    def __getstate__(self) -> dict:
        return {
            "path": self._path,
            "raw": self._raw,
            "extra_ids": self._extra_ids,
            "reverse_extra_ids": self._reverse_extra_ids,
            "overrides": self._overrides,
        }

    def __setstate__(self, state: dict) -> None:
        Vocabulary.__init__(self, state["extra_ids"])
        self._path = state["path"]
        self._reverse_extra_ids = state["reverse_extra_ids"]
        self._overrides = state["overrides"]
        self._load(state["raw"])

    # -- properties ------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def sp_model(self) -> bytes:
        """The serialized model, sentinels included."""
        return self._sp_model

    @property
    def tokenizer(self) -> spm.SentencePieceProcessor:
        return self._sp

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the serialized model with its sentinels: the vocabulary's identity."""
        return self._digest

    @property
    def eos_id(self) -> int | None:
        i = self._sp.eos_id()
        return None if i < 0 else i

    @property
    def unk_id(self) -> int | None:
        i = self._sp.unk_id()
        return None if i < 0 else i

    @property
    def bos_id(self) -> int | None:
        i = self._sp.bos_id()
        return None if i < 0 else i

    @property
    def _base_vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def vocab_size(self) -> int:
        # The sentinels are pieces of the model, so they are already counted.
        return self._sp.GetPieceSize()

    def _content_key(self) -> tuple:
        return (self._digest,)

    def __repr__(self) -> str:
        return f"SentencePieceVocabulary(path={self._path!r}, extra_ids={self._extra_ids}, sha256={self._digest[:12]})"

    # -- python ----------------------------------------------------------------------
    def _encode(self, s: str | bytes) -> list[int]:
        return self._sp.EncodeAsIds(as_input(s))

    def encode_batch(self, texts: list[str | bytes], num_threads: int = -1) -> list[list[int]]:
        """Encodes many texts at once (SentencePiece's threaded batch encoder)."""
        inputs: Any = [as_input(t) for t in texts]  # str and bytes may mix (invalid UTF-8 stays bytes)
        return self._sp.Encode(inputs, out_type=int, num_threads=num_threads)

    def _encode_many(self, texts: list[bytes]) -> list[list[int]]:
        # SentencePiece sets up a thread pool per threaded call: only worth it for big batches.
        return self.encode_batch(list(texts), num_threads=-1 if len(texts) >= 1024 else 1)

    def _decode(self, ids: list[int]) -> str:
        return self._sp.DecodeIds([i for i in ids if i != self.pad_id])
