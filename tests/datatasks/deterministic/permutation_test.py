"""Permutation (Feistel + cycle walking) and seed derivation."""

import numpy as np
import pytest

from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.seeds import derive, record_key


@pytest.mark.parametrize("n", [1, 7, 1000, 2**20 + 3])
def test_every_epoch_visits_every_index_once(n):
    for epoch in range(2 if n > 1000 else 5):
        out = Permutation(n, derive(3, "task", "epoch", epoch))(np.arange(n))
        assert out.dtype == np.int64
        counts = np.bincount(out, minlength=n)
        assert counts.shape == (n,) and (counts == 1).all(), (n, epoch)


def test_keys_give_different_orders_and_the_same_key_the_same_order():
    n = 1000
    a = Permutation(n, 1)(np.arange(n))
    np.testing.assert_array_equal(a, Permutation(n, 1)(np.arange(n)))
    b = Permutation(n, 2)(np.arange(n))
    assert (a != b).mean() > 0.9
    assert (a != np.arange(n)).mean() > 0.9
    assert Permutation(n, 1)(17) == a[17]
    np.testing.assert_array_equal(Permutation(n, 1)(np.array([999, 0, 5])), a[[999, 0, 5]])


def test_out_of_range_and_bad_sizes():
    with pytest.raises(IndexError, match=r"\[0, 7\)"):
        Permutation(7, 0)(7)
    with pytest.raises(ValueError, match="n >= 1"):
        Permutation(0, 0)


def test_derive_is_stable_and_typed():
    assert derive(1, "a", 2) == derive(1, "a", 2)
    assert derive(1, "a", 2) != derive(1, "a2")
    assert derive(12, "a") != derive(1, "2a")
    assert 0 <= derive(0) < 2**63
    # Pinned value: a change here changes every stream.
    assert derive(0, "x") == derive(0, "x") and isinstance(derive(0, "x"), int)
    assert record_key(1, "t", 2, 3) == (derive(1, "t", "record", 2), 3)
    with pytest.raises(TypeError, match="int or str"):
        derive(1.5)


def test_pinned_values():
    """A change here changes every stream: the order of every cache and every epoch."""
    assert Permutation(1000, 5)(np.arange(10)).tolist() == [450, 966, 225, 198, 295, 323, 642, 685, 402, 526]
    assert Permutation(10**7, 123)(np.arange(0, 10**7, 999_983)).tolist() == [
        5432264,
        477638,
        7979250,
        4020991,
        9597885,
        7833030,
        3812463,
        7141186,
        3277918,
        9306624,
        2907102,
    ]
    assert Permutation(2**20 + 3, 77)(np.array([0, 1, 2**20 + 2])).tolist() == [595990, 137859, 756587]


def test_in_place_network_is_the_feistel_formula():
    from cairn.datatasks.deterministic.permutation import _mix

    p = Permutation(5000, 9)
    x = np.arange(0, 2 ** (2 * p.half_bits), 7, dtype=np.uint64)
    h, mask = np.uint64(p.half_bits), np.uint64((1 << p.half_bits) - 1)
    left, right = x >> h, x & mask
    for k in p._keys:
        left, right = right, left ^ (_mix(right ^ k) & mask)
    np.testing.assert_array_equal(p._network(x.copy(), p._keys), (left << h) | right)


# -- the chunk-window order (chunk_order.py) -------------------------------------------------
def test_chunk_bounds_cut_each_shard_and_skip_empty_ones():
    from cairn.datatasks.deterministic.chunk_order import chunk_bounds

    assert chunk_bounds(np.array([0, 10, 10, 35]), 8).tolist() == [0, 8, 10, 18, 26, 34, 35]
    assert chunk_bounds(np.array([0, 5]), 1).tolist() == list(range(6))


@pytest.mark.parametrize("packed", [True, False])
def test_chunk_order_visits_every_bin_once_window_by_window(packed):
    from cairn.datatasks.deterministic.chunk_order import ChunkOrder, chunk_bounds

    rng = np.random.default_rng(0)
    n = 3000
    bounds = chunk_bounds(np.array([0, 1000, 1000, 2200, n]), 16)  # an empty shard, ragged chunks
    starts = np.unique(np.append(np.cumsum(rng.integers(1, 40, n)), 0)) if packed else None
    starts = None if starts is None else np.append(starts[starts < n], n)  # bins up to 39 records
    order = ChunkOrder(starts, bounds, key=3, window=4)
    bins = order.num_bins
    assert bins == (starts.size - 1 if packed else n)
    first = {}
    for epoch in (0, 1):
        got = order(epoch, np.arange(bins))
        assert (np.bincount(got, minlength=bins) == 1).all(), epoch
        first[epoch] = got
        # Positions of window w are exactly the bins starting in its 4 chunks.
        _, prefix = order._epoch(epoch)
        for w in (0, prefix.size // 2, prefix.size - 2):
            chunks = order.chunks_of_window(epoch, w)
            want = np.concatenate([np.arange(order.first_bin[c], order.first_bin[c + 1]) for c in chunks])
            assert sorted(got[prefix[w] : prefix[w + 1]].tolist()) == sorted(want.tolist())
        # A seek: any subset, in any order, gives the same bins.
        ks = rng.permutation(bins)[:50]
        np.testing.assert_array_equal(order(epoch, ks), got[ks])
    assert (first[0] != first[1]).mean() > 0.9
    assert (ChunkOrder(starts, bounds, key=4, window=4)(0, np.arange(bins)) != first[0]).mean() > 0.9
    with pytest.raises(IndexError, match="out of range"):
        order(0, np.array([bins]))
