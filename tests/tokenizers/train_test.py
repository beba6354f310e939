import pytest

from cairn.tokenizers import SentencePieceVocabulary, VocabularyError, train_sentencepiece


def test_training_is_deterministic(lines, tmp_path):
    a = train_sentencepiece(lines[:3000], tmp_path / "a.model", 500)
    b = train_sentencepiece(lines[:3000], tmp_path / "b.model", 500)
    assert a.read_bytes() == b.read_bytes()
    c = train_sentencepiece(lines[1000:4000], tmp_path / "c.model", 500)
    assert c.read_bytes() != a.read_bytes()


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_model_types_give_t5_special_ids(lines, tmp_path, model_type):
    path = train_sentencepiece(lines[:3000], tmp_path / f"{model_type}.model", 600, model_type=model_type)
    vocab = SentencePieceVocabulary(path)
    assert vocab.vocab_size == 600
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (0, 1, 2, None)
    line = "Now is the winter of our discontent"
    assert vocab.decode(vocab.encode(line)) == line


def test_byte_fallback_avoids_unk(lines, tmp_path):
    plain = SentencePieceVocabulary(train_sentencepiece(lines[:3000], tmp_path / "p.model", 400))
    fallback = SentencePieceVocabulary(train_sentencepiece(lines[:3000], tmp_path / "f.model", 400, byte_fallback=True))
    text = "\u4e2d\u6587 \u03b1\u03b2\u03b3"
    assert plain.unk_id in plain.encode(text)
    assert fallback.unk_id not in fallback.encode(text)
    assert fallback.decode(fallback.encode(text)) == text


def test_bad_training_input(tmp_path):
    with pytest.raises(VocabularyError, match="no non-empty line"):
        train_sentencepiece(["", "   ", "\n"], tmp_path / "x.model", 100)
    with pytest.raises(VocabularyError, match="model_type"):
        train_sentencepiece(["a b c"], tmp_path / "x.model", 100, model_type="wordpiece")
    with pytest.raises(VocabularyError, match="vocab_size"):
        train_sentencepiece(["a b c"], tmp_path / "x.model", 2)
    with pytest.raises(VocabularyError, match="training failed"):
        train_sentencepiece(["a b c"], tmp_path / "x.model", 5000)
    assert not (tmp_path / "x.model").exists()
