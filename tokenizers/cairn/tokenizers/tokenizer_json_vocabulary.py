"""`TokenizerJsonVocabulary`: a Hugging Face `tokenizer.json` (e.g. Llama 3's byte-level BPE).

Backed by the `tokenizers` package (the `hf` extra), imported when a vocabulary is first
built, so `import cairn.tokenizers` does not load it.

The contract (tested against transformers' `PreTrainedTokenizerFast(tokenizer_file=path)`):
  * `encode(s)` is `encode(s, add_special_tokens=False)`: no BOS/EOS template (a feature's
    `add_eos` appends EOS, as for the other vocabularies); special tokens written in the text
    (`"</s>"`) encode to their ids, as in transformers. `bytes` are decoded as UTF-8 first,
    invalid bytes becoming U+FFFD (the `tokenizers` library takes only text).
  * `decode(ids)` applies the shared rules (`Vocabulary`), drops PAD (id 0), EOS and BOS ids and
    ids outside the vocabulary, and is `decode(rest, skip_special_tokens=False)`: other
    special tokens render as their text.
Special ids: `pad_id` is 0 (seqio's convention: loss masks and padding use it), whatever token
id 0 is. EOS, BOS and UNK are read from the file unless given (`eos_token=...`): EOS is the
first of `EOS_TOKENS` in the vocabulary, BOS the first of `BOS_TOKENS`, UNK the model's
`unk_token`; None where there is none. `extra_ids=n` adds `<extra_id_{n-1}>` ... `<extra_id_0>`
as special tokens after the vocabulary, so `<extra_id_0>` is `vocab_size - 1` (T5's layout).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from cairn.tokenizers.numpy_tf import NumpyFunctionOps
from cairn.tokenizers.vocabulary import Vocabulary, VocabularyError, as_text

# `tokenizers.Tokenizer` objects are typed `Any`: the package is imported only inside functions.
HFTokenizer = Any

AUTO = "auto"
EOS_TOKENS = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")
BOS_TOKENS = ("<s>", "<|begin_of_text|>", "<bos>")


def _read_file(path: str) -> bytes:
    if "://" in path:  # gs://, s3:// ...: through cairn.storage (fsspec), imported only here.
        from cairn import storage

        try:
            return storage.read_bytes(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"tokenizer.json not found: {path}") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer.json not found: {path}")
    if os.path.isdir(path):
        raise VocabularyError(f"tokenizer.json path is a directory, not a file: {path}")
    with open(path, "rb") as f:
        return f.read()


def _load_tokenizer(raw: bytes, path: str) -> HFTokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError(
            "TokenizerJsonVocabulary needs the Hugging Face `tokenizers` package: pip install ./tokenizers[hf]"
        ) from None
    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the Rust side raises a bare Exception on a bad file
        raise VocabularyError(f"not a tokenizer.json (corrupt or wrong file): {path}: {e}") from None


class TokenizerJsonVocabulary(NumpyFunctionOps, Vocabulary):
    """A Hugging Face `tokenizer.json` as a `Vocabulary` (see the module docstring's contract).

    Args:
      path: the `tokenizer.json` (local, or a URL read through `cairn.storage`).
      extra_ids: number of sentinels `<extra_id_i>` to add at the top of the id space.
      eos_token, bos_token, unk_token: the token of each role, `"auto"` (read from the file, see
        the module docstring) or None (no such id).

    Raises:
      FileNotFoundError: the file does not exist (the message names it).
      VocabularyError: the file is not a tokenizer.json, a named token is not in it, or it
        already holds a sentinel `<extra_id_i>` while `extra_ids` asks to add them.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        extra_ids: int = 0,
        *,
        eos_token: str | None = AUTO,
        bos_token: str | None = AUTO,
        unk_token: str | None = AUTO,
    ):
        super().__init__(extra_ids)
        self._path = os.fspath(path)
        self._roles = {"eos": eos_token, "bos": bos_token, "unk": unk_token}
        self._load(_read_file(self._path))

    def _load(self, raw: bytes) -> None:
        self._raw = raw
        tok = _load_tokenizer(raw, self._path)
        vocab = tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise VocabularyError(f"not a tokenizer.json (it has no tokens): {self._path}")
        self._base = max(vocab.values()) + 1
        self._ids = {role: self._role_id(tok, role, token) for role, token in self._roles.items()}
        self._add_sentinels(tok, vocab)
        self._tok = tok
        self._drop = {i for i in (self.pad_id, self._ids["eos"], self._ids["bos"]) if i is not None}
        settings = json.dumps({"extra_ids": self._extra_ids, **self._ids}, sort_keys=True)
        self._digest = hashlib.sha256(raw + b"\0" + settings.encode()).hexdigest()

    def _role_id(self, tok: HFTokenizer, role: str, token: str | None) -> int | None:
        if token is None:
            return None
        if token != AUTO:
            i = tok.token_to_id(token)
            if i is None:
                raise VocabularyError(f"{role}_token {token!r} is not in the vocabulary of {self._path}")
            return i
        if role == "unk":
            unk = getattr(tok.model, "unk_token", None)  # BPE, WordPiece, WordLevel
            if unk is None:  # Unigram names an id
                return json.loads(self._raw).get("model", {}).get("unk_id")
            return tok.token_to_id(unk)
        names = EOS_TOKENS if role == "eos" else BOS_TOKENS
        return next((tok.token_to_id(t) for t in names if tok.token_to_id(t) is not None), None)

    def _add_sentinels(self, tok: HFTokenizer, vocab: dict[str, int]) -> None:
        if not self._extra_ids:
            return
        from tokenizers import AddedToken

        names = [f"<extra_id_{i}>" for i in reversed(range(self._extra_ids))]
        present = [n for n in names if n in vocab]
        if present:
            raise VocabularyError(
                f"{self._path} already has the sentinel {present[-1]!r}: use extra_ids=0 (its sentinels are its own)"
            )
        tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
        if tok.token_to_id("<extra_id_0>") != self.vocab_size - 1:
            raise VocabularyError(f"{self._path}: the sentinels did not get the top ids (non-contiguous vocabulary?)")

    # -- pickling: the file travels with the object, so no file is needed to unpickle.
    def __getstate__(self) -> dict:
        return {"path": self._path, "raw": self._raw, "extra_ids": self._extra_ids, "roles": self._roles}

    def __setstate__(self, state: dict) -> None:
        Vocabulary.__init__(self, state["extra_ids"])
        self._path = state["path"]
        self._roles = state["roles"]
        self._load(state["raw"])

    # -- properties ------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def tokenizer(self) -> HFTokenizer:
        """The `tokenizers.Tokenizer`, sentinels included."""
        return self._tok

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the file's bytes and the settings (sentinels, special ids)."""
        return self._digest

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def _base_vocab_size(self) -> int:
        return self._base

    def _content_key(self) -> tuple:
        return (self._digest,)

    def __repr__(self) -> str:
        return f"TokenizerJsonVocabulary(path={self._path!r}, extra_ids={self._extra_ids}, sha256={self._digest[:12]})"

    # -- python ----------------------------------------------------------------------
    def _encode(self, s: str | bytes) -> list[int]:
        return self._tok.encode(as_text(s), add_special_tokens=False).ids

    def encode_batch(self, texts: list[str | bytes]) -> list[list[int]]:
        """Encodes many texts at once (the library's parallel batch encoder)."""
        out = self._tok.encode_batch([as_text(t) for t in texts], add_special_tokens=False)
        return [e.ids for e in out]

    def _encode_many(self, texts: list[bytes]) -> list[list[int]]:
        return self.encode_batch(list(texts))

    def _decode(self, ids: list[int]) -> str:
        size, drop = self.vocab_size, self._drop
        return self._tok.decode([i for i in ids if 0 <= i < size and i not in drop], skip_special_tokens=False)

    def decode_batch(self, rows: list[Any]) -> list[str]:
        """`decode` of each row."""
        return [self.decode(r) for r in rows]
