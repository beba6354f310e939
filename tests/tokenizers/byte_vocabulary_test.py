import pickle

import numpy as np

from cairn.tokenizers import ByteVocabulary


def test_byt5_layout():
    v = ByteVocabulary(extra_ids=125)
    assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert v.encode("a") == [ord("a") + 3]
    assert v.encode("\u00e9") == [0xC3 + 3, 0xA9 + 3]
    assert v.vocab_size == 259 + 125
    assert ByteVocabulary().vocab_size == 259


def test_round_trip_on_shakespeare(lines):
    v = ByteVocabulary()
    assert all(v.decode(v.encode(line)) == line for line in lines)


def test_decode_drops_specials_and_sentinels_and_stops_at_eos():
    v = ByteVocabulary(extra_ids=10)
    ids = v.encode("ab") + [0, 2, v.vocab_size - 1, 10_000, -5] + v.encode("c") + [1] + v.encode("d")
    assert v.decode(ids) == "abc"


def test_invalid_utf8_policy():
    v = ByteVocabulary()
    # Encoding bytes keeps them exactly, invalid UTF-8 included.
    assert v.encode(b"a\xffb") == [ord("a") + 3, 0xFF + 3, ord("b") + 3]
    # Decoding ignores invalid sequences, as ByT5 does.
    assert v.decode(v.encode(b"a\xffb")) == "ab"
    assert v.encode("") == [] and v.decode([]) == ""


def test_tf_twins_equal_python(lines):
    import tensorflow as tf

    v = ByteVocabulary(extra_ids=3)
    sample = lines[:500] + ["", "\u00e9t\u00e9 \u2014 na\u00efve"]
    expected = [v.encode(s) for s in sample]
    assert v.encode_tf(tf.constant(sample)).to_list() == expected
    assert v.encode_tf(tf.constant(sample[1])).numpy().tolist() == expected[1]
    rows = [e + [1, 50] for e in expected]
    want = [v.decode(r).encode() for r in rows]
    assert v.decode_tf(tf.ragged.constant(rows)).numpy().tolist() == want
    assert v.decode_tf(tf.ragged.constant(rows).to_tensor()).numpy().tolist() == want
    bad = tf.constant([[ord("a") + 3, 0xFF + 3, ord("b") + 3]])
    assert v.decode_tf(bad).numpy().tolist() == [b"ab"]


def test_equality_hash_pickle():
    assert ByteVocabulary(3) == ByteVocabulary(3)
    assert hash(ByteVocabulary(3)) == hash(ByteVocabulary(3))
    assert ByteVocabulary(3) != ByteVocabulary(4)
    v = pickle.loads(pickle.dumps(ByteVocabulary(7)))
    assert v == ByteVocabulary(7) and v.encode("x") == [ord("x") + 3]
    assert v.decode(np.array([ord("x") + 3])) == "x"
