"""Packing plans, post-cache length functions and the mixture schedule."""

import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks import packing
from cairn.datatasks.deterministic import plan as plan_lib
from cairn.datatasks.deterministic.mixing import MixtureSchedule, block_counts
from cairn.datatasks.errors import DataTasksError
from cairn.tokenizers import ByteVocabulary


def test_greedy_bins_match_the_converters_greedy_packing():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 12, size=(200, 2))
    capacity = np.array([20, 16])
    plan = plan_lib.greedy_bins(lengths, capacity)
    assert plan.starts[0] == 0 and plan.starts[-1] == 200
    for s0, s1 in zip(plan.starts[:-1], plan.starts[1:]):
        assert s1 > s0 and s1 - s0 <= 20
        assert (lengths[s0:s1].sum(0) <= capacity).all()
        if s1 < 200 and s1 - s0 < 20:
            assert (lengths[s0 : s1 + 1].sum(0) > capacity).any()  # greedy: next one does not fit
    # Same rows as packing.pack_group over the whole stream (one group).
    padded = {k: np.zeros((200, 12), np.int32) for k in ("inputs", "targets")}
    for i, (a, b) in enumerate(lengths):
        padded["inputs"][i, :a] = 5
        padded["targets"][i, :b] = 6
    small = {k: v[:20] for k, v in padded.items()}
    rows = packing.pack_group(small, {"inputs": 20, "targets": 16})
    first = plan_lib.greedy_bins(lengths[:20], capacity).starts
    assert rows["inputs"].shape[0] == len(first) - 1


def test_packing_units_per_converter():
    lengths = {"inputs": np.array([3, 60, 0]), "targets": np.array([2, 0, 40])}
    seq = {"inputs": 50, "targets": 30}
    u, cap = dt.EncDecFeatureConverter().packing_units(lengths, seq)
    np.testing.assert_array_equal(u, [[3, 2], [50, 0], [0, 30]])
    np.testing.assert_array_equal(cap, [50, 30])
    u, cap = dt.PrefixLMFeatureConverter().packing_units(lengths, seq)
    np.testing.assert_array_equal(u[:, 0], [5, 51, 30])
    assert cap.tolist() == [80]
    u, cap = dt.LMFeatureConverter().packing_units(lengths, seq)
    np.testing.assert_array_equal(u[:, 0], [2, 0, 30])
    with pytest.raises(DataTasksError, match="'inputs'"):
        dt.EncDecFeatureConverter().packing_units({"targets": lengths["targets"]}, seq)


def test_post_cache_lengths_known_and_unknown():
    # Not at module level: pytest's fixture scan would read an attribute of the lazy module
    # and import TensorFlow, which nothing else in this file needs.
    from cairn.datatasks.lazy_tf import tf

    vocab = ByteVocabulary()
    feats = {"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab, add_eos=False)}
    src = dt.FunctionDataSource(lambda split, shuffle_files: tf.data.Dataset.range(1), ["train"])
    task = dt.Task("t", src, feats, [dt.preprocessors.append_eos_after_trim])
    out = plan_lib.post_cache_lengths(
        task, {"inputs": np.array([3, 10]), "targets": np.array([3, 10])}, {"inputs": 8, "targets": 8}
    )
    np.testing.assert_array_equal(out["inputs"], [4, 8])
    np.testing.assert_array_equal(out["targets"], [3, 8])

    @dt.map_over_dataset(num_seeds=1)
    def shuffle_ids(x, seed):
        return x

    task = dt.Task("u", src, feats, [shuffle_ids])
    with pytest.raises(DataTasksError, match="shuffle_ids.*no length function"):
        plan_lib.post_cache_lengths(task, {"inputs": np.array([3])}, {"inputs": 8})


def test_block_counts_follow_rates():
    c = block_counts(np.array([2.0, 1.0, 1.0]), 1000)
    assert c.sum() == 1000 and c.tolist() == [500, 250, 250]
    c = block_counts(np.array([1.0, 1.0, 1.0]), 1000)
    assert c.sum() == 1000 and sorted(c.tolist()) == [333, 333, 334]


def test_schedule_cursors_count_earlier_rows_of_the_task():
    s = MixtureSchedule(["a", "b", "c"], [0.5, 0.3, 0.2], seed=3, block=64)
    rows = np.arange(300)
    tasks, cursors = s.assign(rows)
    for t in range(3):
        np.testing.assert_array_equal(cursors[tasks == t], np.arange((tasks == t).sum()))
    # Stateless: any subset of rows gets the same answer.
    some = np.array([299, 5, 130, 64])
    t2, c2 = s.assign(some)
    np.testing.assert_array_equal(t2, tasks[some])
    np.testing.assert_array_equal(c2, cursors[some])
    assert np.bincount(tasks[:64], minlength=3).tolist() == [32, 19, 13]
    with pytest.raises(DataTasksError, match="below 1/64"):
        MixtureSchedule(["a", "b"], [1.0, 1e-5], seed=0, block=64)


def _reference_greedy_bins(lengths, capacity):
    """The plan's first algorithm (a Python step per bin), kept as the reference."""
    n = lengths.shape[0]
    index = np.arange(n, dtype=np.int64)
    end = np.minimum(index + int(capacity.max()), n)
    for j in range(lengths.shape[1]):
        cum = np.concatenate([[0], np.cumsum(lengths[:, j], dtype=np.int64)])
        fit = np.searchsorted(cum, cum[:-1] + int(capacity[j]), side="right") - 1
        np.minimum(end, fit, out=end)
    np.maximum(end, index + 1, out=end)
    starts = [0]
    at = 0
    while at < n:
        at = end.item(at)
        starts.append(at)
    return np.asarray(starts, np.int64)


@pytest.mark.parametrize("case", range(24))
def test_fast_greedy_bins_equal_the_reference_on_random_inputs(case):
    rng = np.random.default_rng(case)
    n = int(rng.choice([0, 1, 2, 7, 300, 5000, 20000, 70000]))
    k = int(rng.integers(1, 3))
    capacity = rng.integers(1, 64, size=k)
    high = int(rng.choice([1, 3, 16, 80]))  # lengths over capacity, zeros, tiny rows
    lengths = rng.integers(0, high + 1, size=(n, k))
    if case % 5 == 0:
        lengths[rng.random(n) < 0.3] = 0  # runs of empty records: bins capped by max(capacity)
    want = _reference_greedy_bins(lengths, capacity)
    got = plan_lib.greedy_bins(lengths, capacity)
    np.testing.assert_array_equal(got.starts, want)
    assert got.num_bins == want.size - 1
    chunk = int(rng.choice([1, 5, 64, 1000]))
    if chunk == 1 and n > 5000:  # one call per record: cases 4 and 17 do it on 5,000 records
        chunk = 5
    small = plan_lib.greedy_bins_chunked(lambda a, b: lengths[a:b], n, capacity, chunk=chunk)
    np.testing.assert_array_equal(small.starts, want)


@pytest.mark.parametrize("step", [1, 2, 3, 17, 40, 1000])
def test_chain_follows_every_step(step):
    n = 50_000
    nxt = np.minimum(np.arange(1, n + 2) + (np.arange(n + 1) % step), n)
    want = [0]
    while want[-1] < n:
        want.append(int(nxt[want[-1]]))
    np.testing.assert_array_equal(plan_lib.chain(nxt), want)
    assert plan_lib.chain(np.array([0])).tolist() == [0]


def test_permutation_in_blocks_equals_one_block(monkeypatch):
    from cairn.datatasks.deterministic import permutation

    for n in (5, 1000, 70_001):  # 70,001: two blocks of the default size, too
        p = permutation.Permutation(n, 11)
        whole = p(np.arange(n))
        # Blocks of 64 (of 8,192 for 70,001: 9 blocks, the last partial, not 1,094 of them).
        monkeypatch.setattr(permutation, "_CHUNK", 64 if n < 10_000 else 8_192)
        np.testing.assert_array_equal(p(np.arange(n)), whole)
        np.testing.assert_array_equal(p.range(3, n), whole[3:])
        monkeypatch.undo()
        assert sorted(whole.tolist()) == list(range(n))


@pytest.mark.parametrize("mode,case", [("greedy", 0), ("greedy", 1), ("first_fit", 2), ("first_fit", 3)])
def test_breaks_make_the_plans_of_the_segments_put_together(mode, case):
    """With `breaks` (a cache's chunk ends), no bin spans a break: the plan is the segments'
    own plans, one after another."""
    rng = np.random.default_rng(case)
    n, capacity = 3000, np.array([40, 24])
    lengths = rng.integers(0, 30, size=(n, 2))
    breaks = np.append(np.sort(rng.choice(np.arange(1, n), 40, replace=False)), n)
    build = {
        "greedy": lambda ls, **kw: plan_lib.greedy_bins(ls, capacity, **kw),
        "first_fit": lambda ls, **kw: plan_lib.first_fit_bins(ls, capacity, window=16, **kw),
    }[mode]
    starts, order, at = [0], [], 0
    for b in breaks.tolist():
        part = build(lengths[at:b])
        starts += (part.starts[1:] + at).tolist()
        order += (part.base_positions(np.arange(b - at)) + at).tolist()
        at = b
    got = build(lengths, breaks=breaks)
    np.testing.assert_array_equal(got.starts, starts)
    np.testing.assert_array_equal(got.base_positions(np.arange(n)), order)
    unbroken = build(lengths)
    assert got.num_bins > unbroken.num_bins  # the price: a shorter last bin per segment
    units = lambda a, b: lengths[a:b]
    blocks = {  # read 97 records at a time
        "greedy": lambda: plan_lib.greedy_bins_chunked(units, n, capacity, chunk=97, breaks=breaks),
        "first_fit": lambda: plan_lib.first_fit_bins_chunked(units, n, capacity, 16, chunk=97, breaks=breaks),
    }[mode]()
    np.testing.assert_array_equal(blocks.starts, got.starts)
    assert plan_lib.packed_bins(mode, units, n, capacity, 16, breaks).num_bins == got.num_bins
    with pytest.raises(DataTasksError, match="bin breaks must rise strictly to the record count 3000"):
        build(lengths, breaks=breaks[:-1])
