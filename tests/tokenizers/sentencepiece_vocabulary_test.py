import os
import pickle

import numpy as np
import pytest

from cairn.tokenizers import SentencePieceVocabulary, VocabularyError


# -- round trips on real text ------------------------------------------------------------
def test_exact_round_trip_on_shakespeare(exact_model, lines):
    vocab = SentencePieceVocabulary(exact_model)
    assert len(lines) > 10_000
    failures = [line for line in lines if vocab.decode(vocab.encode(line)) != line]
    assert failures == []


def test_t5_normalization_round_trip_collapses_whitespace(t5_model, lines):
    vocab = SentencePieceVocabulary(t5_model)
    ascii_lines = [line for line in lines if line.isascii()][:3000]
    for line in ascii_lines:
        assert vocab.decode(vocab.encode(line)) == " ".join(line.split())


# -- sentinels (T5's layout) -----------------------------------------------------------
def test_sentinel_layout(t5_model):
    base = SentencePieceVocabulary(t5_model)
    vocab = SentencePieceVocabulary(t5_model, extra_ids=100)
    assert base.vocab_size == 1000
    assert vocab.vocab_size == 1100
    assert vocab.encode("<extra_id_0>") == [vocab.vocab_size - 1]
    assert vocab.encode("<extra_id_99>") == [base.vocab_size]
    ids = vocab.encode("hello <extra_id_3> world")
    assert vocab.vocab_size - 4 in ids
    assert vocab.decode([vocab.vocab_size - 1]) == "<extra_id_0>"
    # Ordinary text encodes the same with and without sentinels.
    assert vocab.encode("To be, or not to be") == base.encode("To be, or not to be")


def test_sentinels_in_increasing_order_when_not_reversed(t5_model):
    vocab = SentencePieceVocabulary(t5_model, extra_ids=10, reverse_extra_ids=False)
    assert vocab.encode("<extra_id_0>") == [1000]
    assert vocab.encode("<extra_id_9>") == [1009]


def test_special_ids(t5_model):
    vocab = SentencePieceVocabulary(t5_model)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (0, 1, 2, None)


# -- decoding rules -----------------------------------------------------------------------
def test_decode_stops_at_eos_and_maps_out_of_range_to_unk(t5_model):
    vocab = SentencePieceVocabulary(t5_model, extra_ids=5)
    hello = vocab.encode("hello")
    world = vocab.encode("world")
    assert vocab.decode(hello + [1] + world) == "hello"
    assert vocab.decode(hello + [0, 0]) == "hello"  # padding renders as nothing
    unk = vocab.decode([2])
    assert unk  # SentencePiece renders UNK as " ⁇ "
    assert vocab.decode([vocab.vocab_size]) == unk
    assert vocab.decode([10**9]) == unk
    assert vocab.decode([-1]) == unk
    assert vocab.decode(np.array(hello, dtype=np.int64)) == "hello"


def test_empty_input(t5_model):
    vocab = SentencePieceVocabulary(t5_model)
    assert vocab.encode("") == []
    assert vocab.decode([]) == ""
    assert vocab.encode_tf("").numpy().tolist() == []


def test_invalid_utf8_bytes_are_encoded_raw_as_unknown(t5_model):
    vocab = SentencePieceVocabulary(t5_model)
    ids = vocab.encode(b"abc \xff\xfe def")
    # The bytes are not decoded first (U+FFFD would normalise to a space and vanish): the
    # invalid run becomes the unknown id, the same in Python and TensorFlow.
    assert vocab.unk_id in ids and ids != vocab.encode("abc \ufffd\ufffd def")
    assert ids == vocab.encode_tf(b"abc \xff\xfe def").numpy().tolist()
    assert vocab.decode(ids).startswith("abc") and vocab.decode(ids).endswith("def")
    assert vocab.encode("caf\u00e9".encode()) == vocab.encode("caf\u00e9")


def test_decode_rejects_non_integer_ids(t5_model):
    vocab = SentencePieceVocabulary(t5_model)
    with pytest.raises(VocabularyError, match="integer"):
        vocab.decode(["a"])
    with pytest.raises(VocabularyError, match="integer"):
        vocab.decode(np.array([1.5]))
    with pytest.raises(VocabularyError, match="1-D"):
        vocab.decode(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(TypeError, match="str or bytes"):
        vocab.encode(123)


# -- TensorFlow twins ----------------------------------------------------------------------
def test_encode_tf_equals_encode_over_1000_lines(t5_model, lines):
    import tensorflow as tf

    vocab = SentencePieceVocabulary(t5_model, extra_ids=100)
    sample = lines[:1000]
    expected = [vocab.encode(line) for line in sample]
    batched = vocab.encode_tf(tf.constant(sample))
    assert batched.to_list() == expected
    ds = tf.data.Dataset.from_tensor_slices(sample).map(vocab.encode_tf)
    assert [x.numpy().tolist() for x in ds] == expected


def test_encode_tf_keeps_outer_shape(t5_model):
    import tensorflow as tf

    vocab = SentencePieceVocabulary(t5_model)
    out = vocab.encode_tf(tf.constant([["a b", "c"], ["d", ""]]))
    assert out.shape[:2] == (2, 2)
    assert out.to_list() == [[vocab.encode("a b"), vocab.encode("c")], [vocab.encode("d"), []]]


def test_decode_tf_equals_decode(t5_model, lines):
    import tensorflow as tf

    vocab = SentencePieceVocabulary(t5_model, extra_ids=3)
    rows = [vocab.encode(line) for line in lines[:200]]
    rows[0] = rows[0] + [1] + vocab.encode("after eos")
    rows[1] = rows[1] + [vocab.vocab_size + 7, -3]
    expected = [vocab.decode(r).encode() for r in rows]
    ragged = tf.ragged.constant(rows, dtype=tf.int32)
    assert vocab.decode_tf(ragged).numpy().tolist() == expected
    dense = ragged.to_tensor()
    assert vocab.decode_tf(dense).numpy().tolist() == expected
    assert vocab.decode_tf(tf.constant(rows[2])).numpy() == expected[2]


# -- identity, pickling -----------------------------------------------------------------
def test_equality_and_hash_by_content(t5_model, exact_model, tmp_path):
    copy = tmp_path / "copy.model"
    copy.write_bytes(t5_model.read_bytes())
    a = SentencePieceVocabulary(t5_model, extra_ids=10)
    b = SentencePieceVocabulary(copy, extra_ids=10)
    assert a == b and hash(a) == hash(b)
    assert a != SentencePieceVocabulary(t5_model, extra_ids=11)
    assert a != SentencePieceVocabulary(exact_model, extra_ids=10)
    assert len({a, b}) == 1


def test_pickle_carries_the_model(t5_model, tmp_path):
    path = tmp_path / "gone.model"
    path.write_bytes(t5_model.read_bytes())
    vocab = SentencePieceVocabulary(path, extra_ids=4)
    blob = pickle.dumps(vocab)
    os.remove(path)
    restored = pickle.loads(blob)
    assert restored == vocab
    assert restored.encode("<extra_id_0> thou") == vocab.encode("<extra_id_0> thou")


def test_normalizer_overrides(t5_model):
    plain = SentencePieceVocabulary(t5_model)
    no_prefix = SentencePieceVocabulary(t5_model, normalizer_spec_overrides={"add_dummy_prefix": False})
    assert plain.encode("hello") != no_prefix.encode("hello")
    assert plain != no_prefix
    with pytest.raises(VocabularyError, match="unknown normalizer_spec field 'nope'"):
        SentencePieceVocabulary(t5_model, normalizer_spec_overrides={"nope": 1})


# -- bad files ---------------------------------------------------------------------------
def test_missing_model_file_names_the_path(tmp_path):
    path = tmp_path / "absent.model"
    with pytest.raises(FileNotFoundError, match="absent.model"):
        SentencePieceVocabulary(path)


@pytest.mark.parametrize("content", [b"", b"\x00" * 10, b"this is not a protobuf at all \xff\xff\xff"])
def test_corrupt_model_file_names_the_path(tmp_path, content):
    path = tmp_path / "corrupt.model"
    path.write_bytes(content)
    with pytest.raises(VocabularyError, match="corrupt.model"):
        SentencePieceVocabulary(path)


def test_truncated_model_file(t5_model, tmp_path):
    path = tmp_path / "truncated.model"
    path.write_bytes(t5_model.read_bytes()[:777])
    with pytest.raises(VocabularyError, match="truncated.model"):
        SentencePieceVocabulary(path)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(VocabularyError, match="directory"):
        SentencePieceVocabulary(tmp_path)
