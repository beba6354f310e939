"""rekey, tokenize, append_eos(_after_trim), trim, prefix_lm, map_over_dataset, determinism flags."""

import functools
import inspect

import numpy as np
import pytest
import tensorflow as tf
from data_util import as_lists, ids_dataset, ids_vocab

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.tokenizers import ByteVocabulary


def strings(**cols):
    return tf.data.Dataset.from_tensor_slices(cols)


def test_rekey_keeps_only_mapped_features():
    ds = pp.rekey(strings(text=["a", "b"], other=["x", "y"]), {"targets": "text", "inputs": None})
    assert as_lists(ds) == [{"targets": b"a", "inputs": b""}, {"targets": b"b", "inputs": b""}]


def test_tokenize_matches_the_vocabulary_and_keeps_text(sp_vocab):
    texts = ["To be, or not to be", "that is the question", ""]
    ds = pp.tokenize(strings(targets=texts, id=["1", "2", "3"]), {"targets": dt.Feature(sp_vocab)})
    out = as_lists(ds)
    assert [o["targets"] for o in out] == [sp_vocab.encode(t) for t in texts]
    assert [o["targets_pretokenized"] for o in out] == [t.encode() for t in texts]
    assert out[0]["id"] == b"1"
    assert ds.element_spec["targets"] == tf.TensorSpec([None], tf.int32)


def test_tokenize_of_a_long_stream_keeps_order(sp_vocab, lines):
    ds = pp.tokenize(strings(targets=lines[:700]), {"targets": dt.Feature(sp_vocab)}, copy_pretokenized=False)
    assert [o["targets"] for o in as_lists(ds)] == [sp_vocab.encode(t) for t in lines[:700]]


def test_tokenize_with_eos(sp_vocab):
    out = as_lists(pp.tokenize(strings(targets=["hello"]), {"targets": dt.Feature(sp_vocab)}, with_eos=True))
    assert out[0]["targets"] == sp_vocab.encode("hello") + [sp_vocab.eos_id]


def test_tokenize_non_scalar_features_path(sp_vocab):
    ds = tf.data.Dataset.from_tensor_slices({"targets": ["a b", "c"]}).map(
        lambda x: {"targets": x["targets"], "ids": tf.range(3)}
    )
    out = as_lists(pp.tokenize(ds, {"targets": dt.Feature(sp_vocab)}))
    assert [o["targets"] for o in out] == [sp_vocab.encode("a b"), sp_vocab.encode("c")]


def test_undecodable_bytes_replace_or_skip_and_are_counted(sp_vocab):
    data = [b"good line", b"bad \xff\xfe line", b"fine"]
    feats = {"targets": dt.Feature(sp_vocab)}
    stats = dt.DataStats()
    out = as_lists(pp.tokenize(strings(targets=data), feats, stats=stats))
    # The raw bytes are encoded (as seqio, and as the vocabulary's own encode of bytes):
    # SentencePiece gives its unknown id for each invalid byte, nothing vanishes.
    assert len(out) == 3 and out[1]["targets"] == sp_vocab.encode(b"bad \xff\xfe line")
    assert sp_vocab.unk_id in out[1]["targets"]
    assert stats.as_dict() == {"undecodable_replaced/targets": 1}
    stats = dt.DataStats()
    out = as_lists(
        pp.tokenize(strings(targets=data), feats, stats=stats, bad_data_policy=dt.BadDataPolicy(undecodable="skip"))
    )
    assert [o["targets_pretokenized"] for o in out] == [b"good line", b"fine"]
    assert stats.as_dict() == {"undecodable_skipped/targets": 1}
    with pytest.raises(ValueError, match="undecodable"):
        dt.BadDataPolicy(undecodable="ignore")


def test_invalid_utf8_policy_is_the_same_in_a_task_and_in_each_vocabulary(sp_vocab):
    raw = b"caf\xe9 \xff ok"
    byte_vocab = ByteVocabulary()
    for vocab in (sp_vocab, byte_vocab):
        out = as_lists(pp.tokenize(strings(targets=[raw]), {"targets": dt.Feature(vocab)}))
        assert out[0]["targets"] == vocab.encode(raw)
        assert out[0]["targets"] == vocab.encode_tf(tf.constant(raw)).numpy().tolist()
    assert byte_vocab.encode(raw) == [b + 3 for b in raw]  # the raw bytes, kept
    assert sp_vocab.encode(raw).count(sp_vocab.unk_id) == 2


def _int_task(values, feature):
    src = dt.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices({"targets": values}), ["train"]
    )
    return dt.Task("ints", src, {"targets": feature}, [pp.tokenize, pp.append_eos_after_trim])


@pytest.mark.parametrize("num_epochs", [1, None])
def test_ids_where_text_is_expected_are_a_named_error(sp_vocab, num_epochs):
    scalar = _int_task(np.array([4, 5], np.int64), dt.Feature(sp_vocab))
    named = r"task 'ints', preprocessor 'tokenize': feature 'targets' is a scalar of int64"
    with pytest.raises(dt.DataTasksError, match=named):
        scalar.get_dataset({"targets": 8}, shuffle=False, num_epochs=num_epochs)
    vectors = _int_task(np.array([[4, 5], [6, 7]], np.int32), dt.Feature(sp_vocab))
    with pytest.raises(dt.DataTasksError, match=r"'targets' is a rank-1 tensor of int32.*token_ids=True"):
        vectors.get_dataset({"targets": 8}, shuffle=False, num_epochs=num_epochs)
    declared = _int_task(np.array([[4, 5], [6, 7]], np.int32), dt.Feature(sp_vocab, token_ids=True))
    rows = as_lists(declared.get_dataset({"targets": 8}, shuffle=False))
    assert [r["targets"] for r in rows] == [[4, 5, sp_vocab.eos_id], [6, 7, sp_vocab.eos_id]]


def test_a_scalar_int_feature_without_tokenize_is_named_by_append_eos(sp_vocab):
    src = dt.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices({"targets": np.array([4], np.int64)}),
        ["train"],
    )
    task = dt.Task("scalar", src, {"targets": dt.Feature(sp_vocab)}, [pp.append_eos_after_trim])
    with pytest.raises(dt.DataTasksError, match="preprocessor 'append_eos_after_trim': feature 'targets' is a scalar"):
        task.get_dataset({"targets": 8}, shuffle=False, num_epochs=None)


def test_append_eos_and_after_trim():
    feats = {"inputs": dt.Feature(ids_vocab(), add_eos=False), "targets": dt.Feature(ids_vocab())}
    ds = ids_dataset([{"inputs": [5, 6, 7, 8], "targets": [5, 6, 7, 8]}])
    assert as_lists(pp.append_eos(ds, feats)) == [{"inputs": [5, 6, 7, 8], "targets": [5, 6, 7, 8, 1]}]
    out = as_lists(pp.append_eos_after_trim(ds, feats, {"inputs": 3, "targets": 3}))
    assert out == [{"inputs": [5, 6, 7, 8], "targets": [5, 6, 1]}]
    assert as_lists(pp.append_eos_after_trim(ds, feats))[0]["targets"] == [5, 6, 7, 8, 1]


def test_trim():
    ds = ids_dataset([{"inputs": [5, 6, 7, 8], "targets": [5, 6]}])
    assert as_lists(pp.trim(ds, {"inputs": 2, "targets": 9})) == [{"inputs": [5, 6], "targets": [5, 6]}]


def test_map_over_dataset_seeds_come_from_seed_and_index():
    @pp.map_over_dataset(num_seeds=2)
    def draw(x, seeds):
        return {"r": tf.random.stateless_uniform([], seeds[0], maxval=10**9, dtype=tf.int32), "x": x}

    ds = tf.data.Dataset.range(6)
    a = [o["r"] for o in as_lists(draw(ds, seed=5))]
    assert a == [o["r"] for o in as_lists(draw(ds, seed=5))]
    assert a != [o["r"] for o in as_lists(draw(ds, seed=6))]
    assert len(set(a)) == 6
    # Example i's seed depends on i only, not on what was read before.
    assert [o["r"] for o in as_lists(draw(ds, seed=5))][3] == a[3]
    assert draw.deterministic is False


def test_map_over_dataset_without_seeds():
    @pp.map_over_dataset
    def double(x):
        return x * 2

    assert list(double(tf.data.Dataset.range(3)).as_numpy_iterator()) == [0, 2, 4]
    assert double.deterministic is True


def test_determinism_flags_and_cacheable_prefix():
    assert pp.is_deterministic(pp.tokenize) and pp.is_deterministic(pp.rekey)
    assert not pp.is_deterministic(pp.span_corruption)
    assert pp.is_deterministic(functools.partial(pp.rekey, key_map={"a": "b"}))
    assert not pp.is_deterministic(lambda ds, seed: ds)
    chain = [pp.rekey, pp.tokenize, pp.append_eos_after_trim, pp.span_corruption]
    assert pp.cacheable_prefix(chain) == 2
    assert pp.cacheable_prefix([pp.rekey, pp.span_corruption, pp.tokenize]) == 1


def test_prefix_lm_splits_a_stream_into_prefix_and_suffix():
    feats = {"inputs": dt.Feature(ids_vocab(1000)), "targets": dt.Feature(ids_vocab(1000))}
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 900, size=40).tolist() for _ in range(20)]
    ds = pp.prefix_lm(ids_dataset([{"targets": d} for d in docs]), {"inputs": 11, "targets": 11}, feats, seed=1)
    out = as_lists(ds)
    assert len(out) == 20 * 4  # 40 tokens -> 4 segments of 10 (inputs length - EOS)
    for o, seg in zip(out, [d[i : i + 10] for d in docs for i in range(0, 40, 10)]):
        assert o["inputs"] + o["targets"] == seg
        assert 1 <= len(o["inputs"]) <= 9


# -- the typed `Preprocessor` protocol ------------------------------------------------------
def test_builtins_are_typed_preprocessors_and_still_callable():
    assert isinstance(pp.span_corruption, pp.Preprocessor)
    assert pp.span_corruption.reads == ("targets",)
    assert pp.span_corruption.writes == ("inputs", "targets")
    assert pp.span_corruption.deterministic is False and pp.tokenize.deterministic is True
    assert pp.span_corruption.__name__ == "span_corruption"
    assert "sequence_length" in inspect.signature(pp.span_corruption).parameters
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant([5, 6, 7])})
    assert as_lists(pp.trim(ds, {"targets": 2})) == [{"targets": [5, 6]}]


def test_span_corruption_states_its_length_rule_once():
    rule = pp.span_corruption.lengths_for({"inputs": 512, "targets": 114})
    assert (rule.reads["targets"], rule.needs["targets"]) == pp.random_spans_helper(512)
    assert pp.span_corruption_one_to_one.lengths_for({"inputs": 512}) == rule
    assert pp.span_corruption.check_sequence_length({"inputs": 512, "targets": 114}) is None
    problem = pp.span_corruption.check_sequence_length({"inputs": 512, "targets": 100})
    assert "needs targets >= 114" in problem and "inputs length 512" in problem
    # reserved_for_packing and noise_density are the preprocessor's own arguments
    rule = pp.span_corruption.lengths_for({"inputs": 512}, reserved_for_packing=2, noise_density=0.3)
    assert rule.needs["targets"] == pp.random_spans_helper(510, 0.3)[1]
    assert "at least 3" in pp.span_corruption.check_sequence_length({"inputs": 2, "targets": 9})


def test_partials_and_plain_functions_are_accepted():
    bound = pp.as_preprocessor(functools.partial(pp.span_corruption, noise_density=0.3))
    assert bound.lengths_for({"inputs": 64}).needs["targets"] == pp.random_spans_helper(64, 0.3)[1]

    def plain(dataset, seed=None):
        return dataset

    wrapped = pp.as_preprocessor(plain)
    assert isinstance(wrapped, pp.Preprocessor) and wrapped.deterministic is False
    assert wrapped.check_sequence_length({"targets": 1}) is None and wrapped.output_lengths is None

    def legacy(dataset):
        return dataset

    legacy.check_sequence_length = lambda sl: "too short" if sl["targets"] < 4 else None
    legacy.deterministic_lengths = lambda lengths, sequence_length, output_features: lengths
    assert pp.as_preprocessor(legacy).check_sequence_length({"targets": 2}) == "too short"
    assert pp.as_preprocessor(legacy).output_lengths is legacy.deterministic_lengths
    with pytest.raises(TypeError, match="must be callable"):
        pp.Preprocessor(3)


def test_preprocessors_pickle_by_reference():
    import pickle

    assert pickle.loads(pickle.dumps(pp.span_corruption)) is pp.span_corruption
    part = pickle.loads(pickle.dumps(functools.partial(pp.random_crop, feature_key="inputs")))
    assert part.func is pp.random_crop
