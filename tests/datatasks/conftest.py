"""Shared fixtures for the datatasks tests (helpers to import live in data_util.py)."""

import pytest

import cairn.datatasks as dt
from cairn.tokenizers import SentencePieceVocabulary, train_sentencepiece


@pytest.fixture(scope="session")
def lines():
    # Imported here: pytest also loads this file for tests/datatasks/deterministic, whose
    # targets do not put this folder (data_util) on the import path.
    from data_util import shakespeare_lines

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
