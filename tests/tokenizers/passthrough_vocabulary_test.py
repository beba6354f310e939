import pickle

import numpy as np
import pytest

from cairn.tokenizers import PassThroughVocabulary, VocabularyError


def test_ids_pass_through_and_decode_cuts_after_eos():
    v = PassThroughVocabulary(100, eos_id=1)
    assert v.encode([5, 6, 7]) == [5, 6, 7]
    assert v.decode([5, 1, 7, 8]) == [5, 1]
    assert v.decode(np.array([9, 8])) == [9, 8]
    assert v.vocab_size == 100 and v.pad_id == 0 and v.unk_id is None


def test_encode_rejects_out_of_range_and_text():
    v = PassThroughVocabulary(10)
    with pytest.raises(VocabularyError, match=r"outside \[0, 10\)"):
        v.encode([3, 10])
    with pytest.raises(VocabularyError, match="outside"):
        v.encode([-1])
    with pytest.raises(VocabularyError, match="not text"):
        v.encode("abc")
    with pytest.raises(VocabularyError, match="positive"):
        PassThroughVocabulary(0)


def test_equality_hash_pickle():
    a, b, c = PassThroughVocabulary(10, 1), PassThroughVocabulary(10, 1), PassThroughVocabulary(11, 1)
    assert a == b and hash(a) == hash(b) and a != c
    assert pickle.loads(pickle.dumps(a)) == a


def test_tf_twins():
    import tensorflow as tf

    v = PassThroughVocabulary(100, eos_id=1)
    assert v.encode_tf(tf.constant([4, 5])).numpy().tolist() == [4, 5]
    assert v.decode_tf(tf.constant([[4, 1, 6], [7, 8, 9]])).numpy().tolist() == [[4, 1, 0], [7, 8, 9]]
