"""`SentencePieceGraph`: SentencePiece's encoding and decoding in plain TensorFlow ops (what a
serving SavedModel carries) equal the `sentencepiece` library's on the same model: Shakespeare's
lines, then text that exercises the normalizer (NFKC folds and compositions, whitespace runs,
control and zero-width characters, invalid UTF-8), unknown characters (merged runs), sentinels;
decoding of random ids (control, UNK, sentinels, after EOS); models it cannot reproduce refused."""

import numpy as np
import pytest
import tensorflow as tf

from cairn.tokenizers import SentencePieceVocabulary, VocabularyError
from cairn.tokenizers.sentencepiece_graph import ModelSpec, SentencePieceGraph

UNUSUAL = [
    "",
    "   ",
    "  To be,   or not\tto be \n",
    "\uff34\uff4f \uff42\uff45",  # full-width letters: NFKC folds them
    "\ufb01ne \u00bd \u2460 \u2122",  # ligature, fraction, circled digit, trademark
    "cafe\u0301 caf\u00e9",  # composed by NFKC / precomposed
    "x\x00y\x07z\u200bw\u00adv",  # control, zero-width, soft hyphen
    "\u2603\u2603 snow \U0001f600\U0001f600!",  # runs of unknown characters
    "\u4f60\u597d \u0391\u03b8\u03ae\u03bd\u03b1",  # CJK, Greek
    "<extra_id_0> and <extra_id_9>",
    "a\u2581<extra_id_3>b",  # the sentinel piece itself, written out
    "\u2581\u2581 spaces\u3000ideographic\u00a0nbsp",
    "tab\there, newline\nthere",
]
INVALID = [b"ab\xffcd", b"\xc3", b"ok \xe2\x82 end", b"\xed\xa0\x80 surrogate"]


@pytest.fixture(scope="module")
def vocab(t5_model):
    return SentencePieceVocabulary(t5_model, extra_ids=10)


class Graph:
    """`SentencePieceGraph`'s encode and decode as `tf.function`s (as a SavedModel traces them)."""

    def __init__(self, model):
        g = SentencePieceGraph(model)
        self.encode = tf.function(g.encode, input_signature=[tf.TensorSpec([None], tf.string)])
        self.decode = tf.function(g.decode, input_signature=[tf.TensorSpec([None, None], tf.int32)])


@pytest.fixture(scope="module")
def graph(vocab):
    return Graph(vocab.sp_model)


def test_encode_equals_sentencepiece_on_shakespeare(vocab, graph, lines):
    sample = lines[::97][:20]
    got = graph.encode(tf.constant(sample)).to_list()
    assert got == [vocab.encode(s) for s in sample]


@pytest.mark.parametrize("text", UNUSUAL + INVALID, ids=range(len(UNUSUAL) + len(INVALID)))
def test_encode_equals_sentencepiece_on_unusual_text(vocab, graph, text):
    raw = text.encode("utf-8") if isinstance(text, str) else text
    assert graph.encode(tf.constant([raw])).to_list() == [vocab.encode(text)]


def test_decode_equals_decode(vocab, graph, lines):
    rng = np.random.default_rng(0)
    special = [0, 1, 2, vocab.vocab_size - 1, vocab.vocab_size - 3]
    rows = [rng.integers(0, vocab.vocab_size, 12).tolist() for _ in range(40)]
    rows += [[rng.choice(special) if rng.random() < 0.4 else int(i) for i in row] for row in rows[:20]]
    rows += [[2, 2, 5], [1, 7, 8], [0, 0, 9], [vocab.encode(" ")[0] if vocab.encode(" ") else 3, 4]]
    rows += [vocab.encode(line)[:12] for line in lines[:40]]
    width = max(len(r) for r in rows)
    dense = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    got = graph.decode(vocab.clean_ids_tf(tf.constant(dense))).numpy()
    assert [g.decode("utf-8") for g in got] == [vocab.decode(r) for r in rows]


def test_models_it_cannot_reproduce_are_refused(exact_model):
    with pytest.raises(VocabularyError, match="byte_fallback"):
        ModelSpec(SentencePieceVocabulary(exact_model).sp_model)
    with pytest.raises(VocabularyError, match="not a SentencePiece model"):
        ModelSpec(b"\x0a\x03abc\xff")
