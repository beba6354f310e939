"""TokenizerJsonVocabulary against transformers' PreTrainedTokenizerFast on the same file.

The file is a Llama-3-style byte-level BPE trained here (conftest `bpe_json`): PAD 0, BOS
`<|begin_of_text|>` 1, EOS `<|end_of_text|>` 2, no UNK.
"""

import os
import pickle

import numpy as np
import pytest

from cairn.tokenizers import TokenizerJsonVocabulary, VocabularyError

EDGE_CASES = [
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\nnewlines\r\n\n",
    "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m",
    "e\u0301 (combining accent) \ufb01 ligature",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\u4e2d\u6587\uff0c\ud55c\uad6d\uc5b4",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
    "emoji \U0001f600\U0001f389 family \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "flags \U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5 heart \u2764\ufe0f",
    "\U0001f44d\U0001f3fd skin tone, \U0001d54f math, \x00 nul, \u2028 separator",
    "numbers 1234567 3.14159 -42 1e10",
    "special tokens in text: <|end_of_text|> and <|begin_of_text|> and <pad>",
    "don't we'll they're I'M",
    "\ufffd replacement char",
]


@pytest.fixture(scope="module")
def hf(bpe_json):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(bpe_json))


@pytest.fixture(scope="module")
def vocab(bpe_json):
    return TokenizerJsonVocabulary(bpe_json)


def hf_decode(hf, vocab, ids):
    """The contract: the shared rules, then PAD/EOS/BOS dropped, then transformers' decode."""
    ids = [i for i in vocab.clean_ids(ids) if i not in (0, vocab.eos_id, vocab.bos_id) and 0 <= i < vocab.vocab_size]
    return hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# -- equal to transformers --------------------------------------------------------------
def test_encode_and_decode_equal_transformers_on_shakespeare(vocab, hf, lines):
    assert len(lines) > 10_000
    expected = hf(lines, add_special_tokens=False)["input_ids"]
    assert vocab.encode_batch(lines) == expected
    assert [vocab.encode(line) for line in lines[:2000]] == expected[:2000]
    decoded = vocab.decode_batch(expected)
    assert decoded == hf.batch_decode(expected, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert decoded == lines  # byte-level BPE is lossless
    assert max(max(r, default=0) for r in expected) < vocab.vocab_size


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_equal_transformers(vocab, hf, text):
    ids = vocab.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert vocab.decode(ids) == hf_decode(hf, vocab, ids)
    assert vocab.encode(text.encode("utf-8")) == ids
    if "<|end_of_text|>" not in text and "<pad>" not in text:
        assert vocab.decode(ids) == text


def test_special_tokens_written_in_text_encode_to_their_ids(vocab):
    ids = vocab.encode("a<|end_of_text|>b")
    assert vocab.eos_id in ids
    # decode cuts at that EOS, as for every vocabulary
    assert vocab.decode(ids) == "a"


def test_invalid_utf8_is_replaced_then_encoded(vocab, hf):
    raw = b"abc \xff\xfe def \xe2\x82"
    text = raw.decode("utf-8", errors="replace")
    ids = vocab.encode(raw)
    assert ids == hf.encode(text, add_special_tokens=False) == vocab.encode(text)
    assert vocab.encode_tf(raw).numpy().tolist() == ids
    assert vocab.decode(ids) == text


def test_decode_of_a_split_multibyte_character_equals_transformers(vocab, hf):
    ids = vocab.encode("\U0001f389\U0001f600")
    for cut in range(len(ids) + 1):
        assert vocab.decode(ids[:cut]) == hf_decode(hf, vocab, ids[:cut])


# -- special ids -------------------------------------------------------------------------
def test_special_ids_are_read_from_the_file(vocab):
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, None)
    assert vocab.vocab_size == vocab.tokenizer.get_vocab_size() == 1000


def test_special_ids_given_as_arguments(bpe_json):
    vocab = TokenizerJsonVocabulary(bpe_json, eos_token="<pad>", bos_token=None, unk_token="<|begin_of_text|>")
    assert (vocab.eos_id, vocab.bos_id, vocab.unk_id) == (0, None, 1)
    assert vocab.decode([10**6, -5]) == vocab.decode([1, 1]) == "<|begin_of_text|>" * 2  # out of range -> UNK
    with pytest.raises(VocabularyError, match="eos_token '<nope>' is not in the vocabulary"):
        TokenizerJsonVocabulary(bpe_json, eos_token="<nope>")


def test_unk_is_the_models_unk_token(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "[UNK]": 2, "hello": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    vocab = TokenizerJsonVocabulary(tmp_path / "tokenizer.json")
    assert (vocab.eos_id, vocab.unk_id, vocab.bos_id) == (1, 2, None)
    assert vocab.encode("hello world") == [3, 2]
    assert vocab.decode([3, 99]) == vocab.decode([3, 2])


# -- decoding rules -----------------------------------------------------------------------
def test_decode_rules(vocab):
    hello, world = vocab.encode("hello"), vocab.encode(" world")
    assert vocab.decode(hello + [vocab.eos_id] + world) == "hello"
    assert vocab.decode(hello + [0, 0]) == "hello"  # padding renders as nothing
    assert vocab.decode([vocab.bos_id] + hello + world) == "hello world"
    assert vocab.decode(hello + [vocab.vocab_size, 10**9, -1]) == "hello"  # no UNK: out of range is dropped
    assert vocab.decode(np.array(hello, dtype=np.int64)) == "hello"
    assert vocab.encode("") == [] and vocab.decode([]) == ""
    with pytest.raises(VocabularyError, match="integer"):
        vocab.decode(["a"])
    with pytest.raises(TypeError, match="str or bytes"):
        vocab.encode(123)


def test_sentinel_layout(bpe_json, vocab):
    sent = TokenizerJsonVocabulary(bpe_json, extra_ids=100)
    assert sent.vocab_size == 1100
    assert sent.encode("<extra_id_0>") == [sent.vocab_size - 1]
    assert sent.encode("<extra_id_99>") == [1000]
    assert sent.decode(sent.encode("thou <extra_id_3> art")) == "thou <extra_id_3> art"
    assert sent.encode("To be, or not to be") == vocab.encode("To be, or not to be")
    assert sent.decode([1099, 5000]) == "<extra_id_0>"
    again = TokenizerJsonVocabulary(sent.path, extra_ids=3)
    assert again.encode("<extra_id_0>") == [1002]


def test_a_file_with_its_own_sentinels_refuses_extra_ids(tmp_path, bpe_json):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bpe_json))
    tok.add_special_tokens(["<extra_id_0>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    assert TokenizerJsonVocabulary(tmp_path / "tokenizer.json").encode("<extra_id_0>") == [1000]
    with pytest.raises(VocabularyError, match="already has the sentinel '<extra_id_0>'"):
        TokenizerJsonVocabulary(tmp_path / "tokenizer.json", extra_ids=2)


# -- TensorFlow twins ----------------------------------------------------------------------
def test_encode_tf_equals_encode(vocab, lines):
    import tensorflow as tf

    sample = lines[:1000] + EDGE_CASES
    expected = vocab.encode_batch(sample)
    assert vocab.encode_tf(tf.constant(sample)).to_list() == expected
    ds = tf.data.Dataset.from_tensor_slices(sample).map(vocab.encode_tf)
    assert [x.numpy().tolist() for x in ds] == expected
    out = vocab.encode_tf(tf.constant([["a b", "c"], ["d", ""]]))
    assert out.shape[:2] == (2, 2)
    assert out.to_list() == [[vocab.encode("a b"), vocab.encode("c")], [vocab.encode("d"), []]]


def test_decode_tf_equals_decode(bpe_json, lines):
    import tensorflow as tf

    vocab = TokenizerJsonVocabulary(bpe_json, extra_ids=3)
    rows = vocab.encode_batch(lines[:200] + EDGE_CASES)
    rows[0] = rows[0] + [vocab.eos_id] + vocab.encode("after eos")
    rows[1] = rows[1] + [vocab.vocab_size + 7, -3, vocab.vocab_size - 1]
    expected = [vocab.decode(r).encode() for r in rows]
    ragged = tf.ragged.constant(rows, dtype=tf.int32)
    assert vocab.decode_tf(ragged).numpy().tolist() == expected
    assert vocab.decode_tf(ragged.to_tensor()).numpy().tolist() == expected
    assert vocab.decode_tf(tf.constant(rows[2])).numpy() == expected[2]


# -- identity, pickling, bad files ---------------------------------------------------------
def test_equality_hash_and_fingerprint_by_content(bpe_json, tmp_path):
    import hashlib

    copy = tmp_path / "copy.json"
    copy.write_bytes(bpe_json.read_bytes())
    a, b = TokenizerJsonVocabulary(bpe_json, extra_ids=10), TokenizerJsonVocabulary(copy, extra_ids=10)
    assert a == b and hash(a) == hash(b) and a.fingerprint == b.fingerprint
    settings = b'{"bos": 1, "eos": 2, "extra_ids": 10, "unk": null}'
    assert a.fingerprint == hashlib.sha256(bpe_json.read_bytes() + b"\0" + settings).hexdigest()
    assert a != TokenizerJsonVocabulary(bpe_json, extra_ids=11)
    assert a != TokenizerJsonVocabulary(bpe_json, extra_ids=10, eos_token="<pad>")
    copy.write_bytes(bpe_json.read_bytes().replace(b'"<pad>"', b'"<PAD>"'))
    assert a != TokenizerJsonVocabulary(copy, extra_ids=10)


def test_pickle_carries_the_file(bpe_json, tmp_path):
    path = tmp_path / "gone.json"
    path.write_bytes(bpe_json.read_bytes())
    vocab = TokenizerJsonVocabulary(path, extra_ids=4, bos_token=None)
    blob = pickle.dumps(vocab)
    os.remove(path)
    restored = pickle.loads(blob)
    assert restored == vocab and restored.bos_id is None
    assert restored.encode("<extra_id_0> thou") == vocab.encode("<extra_id_0> thou")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.json"):
        TokenizerJsonVocabulary(tmp_path / "absent.json")
    with pytest.raises(VocabularyError, match="directory"):
        TokenizerJsonVocabulary(tmp_path)


@pytest.mark.parametrize("content", [b"", b"{}", b'{"model": ', b"\xff\xfe not json", b'{"version": "1.0"}'])
def test_corrupt_file_names_the_path(tmp_path, content):
    path = tmp_path / "corrupt.json"
    path.write_bytes(content)
    with pytest.raises(VocabularyError, match="corrupt.json"):
        TokenizerJsonVocabulary(path)
