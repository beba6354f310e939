"""`train_sentencepiece`: train a SentencePiece model from an iterable of strings.

The model uses T5's special ids (PAD 0, EOS 1, UNK 2, no BOS), so it plugs straight into
`SentencePieceVocabulary`. Training is deterministic for the same lines and options
(input order is kept; no sampling of sentences).
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from cairn.tokenizers.vocabulary import VocabularyError, as_text

_MODEL_TYPES = ("unigram", "bpe", "char", "word")


def train_sentencepiece(
    lines: Iterable[str | bytes],
    output_path: str | os.PathLike,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    byte_fallback: bool = False,
    character_coverage: float = 1.0,
    normalization: str = "nmt_nfkc",
    remove_extra_whitespaces: bool = True,
    split_digits: bool = False,
    user_defined_symbols: Sequence[str] = (),
    max_sentence_length: int = 4192,
    max_lines: int = 0,
    num_threads: int = 1,
) -> pathlib.Path | str:
    """Trains a model on `lines` and writes it to `output_path` (a `.model` file).

    Args:
      lines: training text, one sentence or line per item; empty lines are skipped.
      output_path: where the serialized model is written (atomically; a local path or a
        `gs://` URL, through `cairn.storage`).
      vocab_size: number of pieces, PAD/EOS/UNK included.
      model_type: "unigram" (T5's choice), "bpe", "char" or "word".
      byte_fallback: unknown characters become byte pieces instead of UNK.
      character_coverage: fraction of characters the model must cover.
      normalization: "nmt_nfkc" (T5's), "nfkc", "identity" (exact round trips) ...
      remove_extra_whitespaces: collapse runs of whitespace while normalizing.
      split_digits: split numbers into single digits.
      user_defined_symbols: pieces that always stay whole.
      max_sentence_length: longer lines (in bytes) are skipped by the trainer.
      max_lines: train on at most this many lines (0: all), taken in order.
      num_threads: trainer threads.

    Returns:
      The path written (a `pathlib.Path`; the URL string for a URL).

    Raises:
      VocabularyError: bad options, or no non-empty line to train on.
    """
    if model_type not in _MODEL_TYPES:
        raise VocabularyError(f"model_type must be one of {_MODEL_TYPES}, got {model_type!r}")
    if not isinstance(vocab_size, int) or vocab_size < 4:
        raise VocabularyError(f"vocab_size must be an int >= 4, got {vocab_size!r}")
    texts = []
    for line in lines:
        text = as_text(line).strip("\n")
        if text.strip():
            texts.append(text)
            if max_lines and len(texts) >= max_lines:
                break
    if not texts:
        raise VocabularyError("train_sentencepiece got no non-empty line to train on")

    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            byte_fallback=byte_fallback,
            character_coverage=character_coverage,
            normalization_rule_name=normalization,
            remove_extra_whitespaces=remove_extra_whitespaces,
            split_digits=split_digits,
            user_defined_symbols=list(user_defined_symbols),
            max_sentence_length=max_sentence_length,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            shuffle_input_sentence=False,
            input_sentence_size=0,
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as e:  # e.g. a vocab_size larger than the text allows
        raise VocabularyError(f"SentencePiece training failed: {e}") from None

    from cairn import storage  # the one atomic write (local rename, or one upload at a URL)

    storage.write_bytes(output_path, buffer.getvalue())
    return os.fspath(output_path) if storage.is_url(output_path) else pathlib.Path(output_path)
