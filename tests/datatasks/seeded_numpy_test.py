"""seeded_numpy: the NumPy `random_crop` and `span_corruption_one_to_one` equal their
TensorFlow versions record for record, for records seeded as the deterministic reader
seeds them (`(epoch key, record id)` folded with the preprocessor's position)."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from data_util import ids_vocab

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks import stateless_numpy as sn
from cairn.datatasks.deterministic.seeds import record_key
from cairn.datatasks.preprocessors import seeded_numpy
from cairn.datatasks.preprocessors.base import as_preprocessor, call_preprocessor
from cairn.datatasks.ragged import Ragged

VOCAB = 1000
POSITION = 4  # after the cached preprocessors, as in the Shakespeare tasks
N = 300
# Records compared with TensorFlow (each run alone through the TF preprocessor, the costly
# side): every record is an exact comparison on its own seed, and the 12 edge lengths are
# always among them; 120 records (about 70 of 512 tokens, each hundreds of draws) hold as many
# span layouts and crop offsets as a test can use, at 40% of 300's CPU.
N_TF = 120


def records(n=N, seed=0):
    """Cached-chunk-like token rows (mostly 512 long) plus the edge lengths, and an extra
    numeric feature that must pass through."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n) < 0.6, 512, rng.integers(0, 700, n))
    lengths[:12] = [0, 1, 2, 3, 4, 5, 69, 70, 71, 567, 568, 569]
    targets = [rng.integers(3, VOCAB - 100, k).astype(np.int32) for k in lengths]
    extra = [rng.integers(0, 9, k % 7).astype(np.int32) for k in lengths]
    return {"targets": targets, "extra": extra}


def reader_keys(n=N, epochs=(0, 1, 2), seed=11):
    """`[n, 2]` int64 record keys `(epoch key, record id)`, records spread over `epochs`."""
    epoch = np.asarray(epochs)[np.arange(n) % len(epochs)]
    return np.stack([[record_key(seed, "t", int(e), 0)[0] for e in epoch], np.arange(n)], 1).astype(np.int64)


def tf_reference(pre, rows, keys, sequence_length, output_features):
    """Each record alone through the TensorFlow preprocessor, seeded as `Task.preprocess`
    seeds it (`stateless_fold_in(record key, position)`)."""
    ragged = {k: tf.RaggedTensor.from_row_lengths(np.concatenate(v), [len(r) for r in v]) for k, v in rows.items()}

    def one(x, key):
        seed = tf.random.experimental.stateless_fold_in(key, POSITION)
        ds = tf.data.Dataset.from_tensors(x)
        return call_preprocessor(pre, ds, output_features=output_features, sequence_length=sequence_length, seed=seed)

    ds = tf.data.Dataset.from_tensor_slices((ragged, keys)).flat_map(one)
    return list(ds.as_numpy_iterator())


def numpy_run(pre, rows, keys, sequence_length, output_features):
    features = {k: Ragged.from_list(v) for k, v in rows.items()}
    seed = sn.fold_in(keys, POSITION)
    return as_preprocessor(pre).numpy_fn(features, sequence_length, output_features, seed=seed)


def assert_same(got, want, n):
    assert len(want) == n
    for k in want[0]:
        assert got[k].lengths.size == n
        rows = got[k].to_list()
        for i, ex in enumerate(want):
            assert rows[i].dtype == ex[k].dtype, k
            np.testing.assert_array_equal(rows[i], ex[k], err_msg=f"{k} of record {i}")
    assert sorted(got) == sorted(want[0])


def features(*names, add_eos=True):
    return {k: dt.Feature(ids_vocab(VOCAB), add_eos=add_eos) for k in names}


CASES = {
    "random_crop": (pp.random_crop, {"targets": 37}, features("targets", add_eos=False)),
    "random_crop_eos": (pp.random_crop, {"targets": 64}, features("targets")),
    "random_crop_extra": (functools.partial(pp.random_crop, feature_key="extra"), {"extra": 3}, features("extra")),
    "prefix_lm": (pp.prefix_lm_one_to_one, {"inputs": 24, "targets": 16}, features("inputs", "targets")),
    # The default experiment's lengths (inputs 64: 70 tokens per example).
    "span_corruption_64": (pp.span_corruption_one_to_one, {"inputs": 64, "targets": 16}, features("inputs", "targets")),
    "span_corruption_512": (
        pp.span_corruption_one_to_one,
        {"inputs": 512, "targets": 114},
        features("inputs", "targets"),
    ),
    "span_corruption_dense": (
        functools.partial(pp.span_corruption_one_to_one, noise_density=0.3, mean_noise_span_length=2.0),
        {"inputs": 40, "targets": 40},
        features("inputs", "targets"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_equals_tensorflow_record_for_record(case):
    pre, lengths, feats = CASES[case]
    rows, keys = records(N_TF), reader_keys(N_TF)
    want = tf_reference(pre, rows, keys, lengths, feats)
    got = numpy_run(pre, rows, keys, lengths, feats)
    assert_same(got, want, N_TF)
    # Records are independent: a shuffled subset gives the same rows.
    pick = np.random.default_rng(1).permutation(N_TF)[:50]
    sub = numpy_run(pre, {k: [v[i] for i in pick] for k, v in rows.items()}, keys[pick], lengths, feats)
    for k in got:
        for j, i in enumerate(pick):
            np.testing.assert_array_equal(sub[k].to_list()[j], got[k].to_list()[i])


def test_outputs_depend_on_the_epoch_and_record():
    pre, lengths, feats = CASES["span_corruption_64"]
    rows = records()
    a = numpy_run(pre, rows, reader_keys(epochs=(0,)), lengths, feats)["inputs"].to_list()
    b = numpy_run(pre, rows, reader_keys(epochs=(1,)), lengths, feats)["inputs"].to_list()
    differ = sum(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, b))
    assert differ > 0.9 * N
    crop = numpy_run(pp.random_crop, rows, reader_keys(), {"targets": 37}, features("targets", add_eos=False))
    firsts = {int(r[0]) for r in crop["targets"].to_list() if r.size}
    assert len(firsts) > 100  # windows start at many offsets, not at 0


def test_sentinels_count_down_from_the_vocabulary_top():
    pre, lengths, feats = CASES["span_corruption_64"]
    got = numpy_run(pre, records(), reader_keys(), lengths, feats)
    for inputs, targets in zip(got["inputs"].to_list()[12:], got["targets"].to_list()[12:]):
        sent_in = inputs[inputs >= VOCAB - 100]
        np.testing.assert_array_equal(sent_in, VOCAB - 1 - np.arange(sent_in.size))
        assert targets[0] == VOCAB - 1


def test_seeds_are_required():
    pre, lengths, feats = CASES["random_crop"]
    fn = as_preprocessor(pre).numpy_fn
    with pytest.raises(ValueError, match="seed"):
        fn({"targets": Ragged.from_list([np.arange(5)])}, lengths, feats)
    with pytest.raises(ValueError, match="seed"):
        seeded_numpy.example_seeds(np.zeros(2, np.int32), 1)
