"""stateless_numpy: TensorFlow's stateless random ops on CPU, bit for bit, without TensorFlow."""

import numpy as np
import pytest
import tensorflow as tf

from cairn.datatasks import stateless_numpy as sn


def same(got, want):
    """Equal dtype, shape and bytes (floats compared bit for bit)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), (got.ravel()[:8], want.ravel()[:8])


def seeds(dtype, n, rng_seed=0):
    """`n` seeds `[2]` of `dtype`: the extremes first, then random ones."""
    info = np.iinfo(dtype)
    edges = [[0, 0], [1, 2], [-1, -1], [info.max, info.min], [info.min, 0], [0, info.max]]
    rng = np.random.default_rng(rng_seed)
    rand = rng.integers(info.min, info.max, size=(max(n - len(edges), 0), 2), dtype=dtype, endpoint=True)
    return np.concatenate([np.array(edges, dtype), rand])[:n]


ALL_SEEDS = [s for dt in (np.int32, np.int64) for s in seeds(dt, 10)]


def test_philox_known_answers():
    # Random123's known-answer vectors for Philox-4x32-10.
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for counter, key, want in cases:
        np.testing.assert_array_equal(sn.philox(np.array(counter, np.uint32), np.array(key, np.uint32)), want)


def test_documented_examples_without_tensorflow():
    # The values in TensorFlow's own docstrings of split and fold_in.
    split = sn.split(np.array([1, 2], np.int32), 3)
    np.testing.assert_array_equal(split, [[1105988140, 1738052849], [-335576002, 370444179], [10670227, -246211131]])
    np.testing.assert_array_equal(sn.fold_in(np.array([1, 2], np.int32), 3), [1105988140, 3])


@pytest.mark.parametrize("seed", ALL_SEEDS, ids=lambda s: f"{s.dtype}:{s[0]}:{s[1]}")
def test_uniform_float32(seed):
    for shape in [(), (0,), (1,), (3,), (4,), (5,), (1000,), (3, 5)]:
        same(sn.uniform_float32(seed, shape), tf.random.stateless_uniform(shape, seed=seed))


@pytest.mark.parametrize("seed", ALL_SEEDS, ids=lambda s: f"{s.dtype}:{s[0]}:{s[1]}")
def test_uniform_int(seed):
    for maxval in (1, 2, 3, 7, 100, 12345678, 2**31 - 1):
        for shape in [(), (0,), (1,), (5,), (1000,)]:
            want = tf.random.stateless_uniform(shape, seed=seed, maxval=maxval, dtype=tf.int32)
            same(sn.uniform_int(seed, shape, 0, maxval), want)
    for lo, hi in ((-5, 5), (3, 259), (-(2**31), 0), (-(2**31), 2**31 - 1)):
        same(sn.uniform_int(seed, (9,), lo, hi), tf.random.stateless_uniform([9], seed, lo, hi, dtype=tf.int32))
    for lo, hi in ((0, 1), (-5, 5), (0, 2**40 + 3), (-(2**63), 2**63 - 1)):
        want = tf.random.stateless_uniform([9], seed, tf.constant(lo, tf.int64), tf.constant(hi, tf.int64), tf.int64)
        same(sn.uniform_int(seed, (9,), lo, hi, np.int64), want)


@pytest.mark.parametrize("seed", ALL_SEEDS, ids=lambda s: f"{s.dtype}:{s[0]}:{s[1]}")
def test_full_range_fold_in_and_split(seed):
    for dtype in (np.int32, np.int64):
        for shape in [(), (1,), (5,), (3, 2)]:
            want = tf.random.stateless_uniform(shape, seed, None, None, dtype=tf.as_dtype(dtype))
            same(sn.uniform_full_int(seed, shape, dtype), want)
    for data in (0, 1, 5, -3, 2**31 - 1):
        same(sn.fold_in(seed, data), tf.random.experimental.stateless_fold_in(seed, data))
        data64 = tf.constant(data, tf.int64)
        same(sn.fold_in(seed, data, np.int64), tf.random.experimental.stateless_fold_in(seed, data64))
    for num in (1, 2, 3, 6, 10):
        same(sn.split(seed, num), tf.random.experimental.stateless_split(seed, num))


def test_many_seeds_at_once():
    batch = seeds(np.int32, 40, rng_seed=1)
    same(sn.uniform_float32(batch, (17,)), tf.stack([tf.random.stateless_uniform([17], s) for s in batch]))
    same(sn.fold_in(batch, 4), tf.stack([tf.random.experimental.stateless_fold_in(s, 4) for s in batch]))
    maxval = np.arange(1, 41, dtype=np.int32) * 37
    want = [tf.random.stateless_uniform([], s, maxval=int(m), dtype=tf.int32) for s, m in zip(batch, maxval)]
    same(sn.uniform_int(batch, (), 0, maxval), tf.stack(want))
    counts = np.random.default_rng(2).integers(0, 30, 40)
    counts[:3] = [0, 4, 1]
    want = tf.concat([tf.random.stateless_uniform([int(c)], s) for s, c in zip(batch, counts)], 0)
    same(sn.words_to_float32(sn.ragged_words(batch, counts)), want)


def test_argsort_keeps_ties_in_order_like_tensorflow():
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 5, 100, 2000):
        for levels in (1, 2, 5, 2**23):  # float32 uniforms have 2**23 values: ties do happen
            v = (rng.integers(0, levels, n) / np.float32(2**23)).astype(np.float32)
            np.testing.assert_array_equal(sn.argsort(v), tf.argsort(v).numpy(), err_msg=f"n={n} levels={levels}")
    tied = 0
    for seed in seeds(np.int64, 60, rng_seed=4):
        v = sn.uniform_float32(seed, (3000,))
        tied += v.size - np.unique(v).size
        np.testing.assert_array_equal(sn.argsort(v), tf.argsort(tf.random.stateless_uniform([3000], seed)).numpy())
    assert tied > 0  # real draws with ties were compared


def test_seeds_are_checked():
    with pytest.raises(ValueError):
        sn.uniform_float32(np.array([1, 2, 3]), (2,))
    with pytest.raises(ValueError):
        sn.uniform_float32(np.array([1.0, 2.0]), (2,))
    with pytest.raises(ValueError):
        sn.uniform_int(np.array([1, 2]), (2,), 5, 5)
