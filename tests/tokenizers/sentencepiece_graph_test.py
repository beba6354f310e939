"""`SentencePieceGraph`: SentencePiece's encoding and decoding in plain TensorFlow ops (what a
serving SavedModel carries) equal the `sentencepiece` library's on the same model, over a corpus
of 12,000 lines encoded in a few large calls: Shakespeare's lines, text that exercises the
normalizer (NFKC folds and compositions, whitespace runs, control and zero-width characters,
invalid UTF-8), unknown characters (merged runs), sentinels, and seeded lines of unusual Unicode
(combining marks, CJK, emoji, right-to-left text, NUL and control characters, invalid bytes,
long space runs); the same under other normalizer settings, with user-defined pieces that cross
words, and on one 200,000-character input; decoding of random ids (control, UNK, sentinels, after
EOS); models it cannot reproduce refused."""

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
INVALID = [b"ab\xffcd", b"\xc3", b"ok \xe2\x82 end", b"\xed\xa0\x80 surrogate", b"\xef\xbf\xbd literal U+FFFD"]
# Pools the generated lines draw from: combining marks, CJK, kana, hangul, emoji (ZWJ sequences,
# skin tones, flags), right-to-left text and marks, NUL and control characters, odd spaces,
# forms NFKC folds, U+FFFD / U+2581 / U+2047, Latin.
POOLS = [
    "\u0301\u0308\u0327\u0323\u20dd\u0489",
    "\u4f60\u597d\u4e16\u754c\u65e5\u672c\u8a9e\u6f22\u5b57\u3042\u30a2\uac00\ud55c",
    "\U0001f600\U0001f44d\U0001f3fd\u200d\U0001f468\U0001f469\U0001f1eb\U0001f1f7\u2764\ufe0f\U0001f9d1",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u05e2\u05d1\u05e8\u05d9\u05ea\u200f\u200e\u202b\u202c",
    "\x00\x01\x07\x08\x0b\x0c\x1b\x7f\x85\u2028\u2029",
    " \t\n\r\u00a0\u3000\u2002\u2009\u200b\u205f\ufeff",
    "\uff21\uff42\uff43\ufb01\ufb02\u00bd\u2460\u2122\u00b2\u2163\u3250\u33a1\u00c5\u212b",
    "\ufffd\u2581\u2047<>_",
    "abcdefghijklmnopqrstuvwxyz ABCDEFG 0123456789 .,;:!?'\"-()",
]
BAD_BYTES = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80", b"\xf0\x9f"]


def unusual_lines(words: list, count: int, seed: int = 0) -> list:
    """`count` seeded lines (bytes) mixing `words` with the pools, space runs, sentinels' text
    and invalid UTF-8."""
    rng = np.random.default_rng(seed)
    glue = [b"", b" ", b"  ", b"\t"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            kind = rng.random()
            if kind < 0.35:
                parts.append(str(words[rng.integers(len(words))]).encode())
            elif kind < 0.8:
                pool = POOLS[rng.integers(len(POOLS))]
                parts.append("".join(pool[rng.integers(len(pool))] for _ in range(rng.integers(1, 6))).encode())
            elif kind < 0.88:
                parts.append(b" " * int(rng.integers(2, 40)))
            elif kind < 0.94:
                parts.append(BAD_BYTES[rng.integers(len(BAD_BYTES))])
            else:
                parts.append(f"<extra_id_{rng.integers(12)}>".encode())
        out.append(b"".join(p + glue[rng.integers(len(glue))] for p in parts))
    return out


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


@pytest.fixture(scope="module")
def corpus(lines):
    """Shakespeare's lines (10,680), the unusual texts above and 1,400 generated lines: bytes."""
    unusual = [t.encode("utf-8") if isinstance(t, str) else t for t in UNUSUAL + INVALID]
    words = " ".join(lines[:2000]).split()
    return [line.encode("utf-8") for line in lines] + unusual + unusual_lines(words, 1400)


def encode_all(graph, texts, chunk=6000):
    return [
        ids for i in range(0, len(texts), chunk) for ids in graph.encode(tf.constant(texts[i : i + chunk])).to_list()
    ]


def test_encode_equals_sentencepiece_on_corpus(vocab, graph, corpus):
    assert len(corpus) >= 12000  # 10,000 at least, as issue 57 asks
    assert encode_all(graph, corpus) == vocab.encode_batch(corpus)


def test_encode_under_other_normalizer_settings(t5_model, corpus):
    """No whitespace folding and no U+2581 escaping: the branches the default model skips."""
    vocab = SentencePieceVocabulary(
        t5_model,
        extra_ids=10,
        normalizer_spec_overrides={"remove_extra_whitespaces": False, "escape_whitespaces": False},
    )
    sample = corpus[::6]
    assert encode_all(Graph(vocab.sp_model), sample) == vocab.encode_batch(sample)


def test_user_defined_pieces_across_words(lines, corpus, tmp_path):
    """User-defined pieces that compete with normal ones, one with U+2581 inside (so no word
    split: each string is one word), spaces kept: SentencePiece's user-defined scores."""
    from cairn.tokenizers import train_sentencepiece

    model = train_sentencepiece(lines, tmp_path / "user.model", 1000, user_defined_symbols=["\u2581\u2581", "a\u2581b"])
    vocab = SentencePieceVocabulary(model, normalizer_spec_overrides={"remove_extra_whitespaces": False})
    graph = SentencePieceGraph(vocab.sp_model)
    assert not graph.split_words
    sample = corpus[::4]
    assert encode_all(Graph(vocab.sp_model), sample) == vocab.encode_batch(sample)


def test_one_long_input_equals_sentencepiece(vocab, graph, lines):
    """200,000 characters (SentencePiece rebases its scores each time they pass -100,000), then
    batches without a character."""
    text = " ".join(lines)[:200000].encode("utf-8")
    assert graph.encode(tf.constant([text, b"", text[:7]])).to_list() == vocab.encode_batch([text, b"", text[:7]])
    assert graph.encode(tf.constant([b"", b"  "])).to_list() == [[], []]  # no word at all
    assert graph.encode(tf.constant([], tf.string)).to_list() == []


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
