"""`packing="first_fit"`: fuller rows than greedy, deterministic, resumable, elastic; greedy
stays the default."""

import det_run
import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic import DeterministicReader
from cairn.datatasks.deterministic import plan as plan_lib
from cairn.datatasks.deterministic.chunk_order import chunk_bounds
from cairn.datatasks.errors import DataTasksError


def corpus(n=20_000, seed=0):
    """Short-line-like lengths: [N, 2] (inputs, targets), geometric, capped."""
    rng = np.random.default_rng(seed)
    return np.stack([np.minimum(rng.geometric(1 / 9, n) + 1, 128), np.minimum(rng.geometric(1 / 9, n) + 1, 64)], 1)


def targets_fill(lengths, plan, capacity):
    return lengths[:, 1].sum() / (plan.num_bins * capacity[1])


def test_first_fit_fills_more_than_greedy_on_a_synthetic_corpus():
    lengths, capacity = corpus(), np.array([128, 64])
    greedy = plan_lib.greedy_bins(lengths, capacity)
    first_fit = plan_lib.first_fit_bins(lengths, capacity, window=128)
    g, f = targets_fill(lengths, greedy, capacity), targets_fill(lengths, first_fit, capacity)
    assert f > g + 0.02 and f >= 0.99, (g, f)
    assert first_fit.num_bins < greedy.num_bins


@pytest.mark.parametrize("window", [1, 3, 64])
def test_every_record_once_bins_fit_and_waits_are_bounded(window):
    lengths, capacity = corpus(3000, seed=window), np.array([128, 64])
    plan = plan_lib.first_fit_bins(lengths, capacity, window=window)
    assert sorted(plan.order.tolist()) == list(range(3000))
    placed_in = np.empty(3000, np.int64)
    for b in range(plan.num_bins):
        ids = plan.base_positions(np.arange(plan.starts[b], plan.starts[b + 1]))
        assert ids.size >= 1 and (np.diff(ids) > 0).all()  # in base order within a row
        assert (lengths[ids].sum(0) <= capacity).all() and ids.size <= capacity.max()
        placed_in[ids] = b
    # A bin starts with the window's first record: record i is placed by bin i.
    assert (placed_in <= np.arange(3000)).all()
    if window == 1:  # a window of one is greedy
        np.testing.assert_array_equal(plan.starts, plan_lib.greedy_bins(lengths, capacity).starts)
        np.testing.assert_array_equal(plan.order, np.arange(3000))


def test_plan_is_a_pure_function_of_the_lengths():
    lengths, capacity = corpus(5000), np.array([128, 64])
    a = plan_lib.first_fit_bins(lengths, capacity, window=32)
    for chunk in (1, 7, 100, 1 << 16):
        b = plan_lib.first_fit_bins_chunked(lambda s, e: lengths[s:e], 5000, capacity, 32, chunk=chunk)
        np.testing.assert_array_equal(a.starts, b.starts)
        np.testing.assert_array_equal(a.order, b.order)


def test_over_capacity_and_empty_records():
    lengths = np.array([[0, 0], [9, 9], [0, 0], [3, 3], [0, 0]])
    plan = plan_lib.first_fit_bins(lengths, np.array([4, 4]), window=4)
    bins = [plan.base_positions(np.arange(plan.starts[b], plan.starts[b + 1])).tolist() for b in range(plan.num_bins)]
    assert bins == [[0, 2, 3, 4], [1]]
    assert plan_lib.first_fit_bins(np.zeros((0, 2), np.int64), np.array([4, 4])).num_bins == 0


def test_bad_options():
    with pytest.raises(DataTasksError, match="unknown packing mode 'best_fit'"):
        plan_lib.packed_bins("best_fit", lambda a, b: np.zeros((b - a, 1)), 3, np.array([4]))
    with pytest.raises(DataTasksError, match="window must be a positive integer, got 0"):
        plan_lib.first_fit_bins(np.ones((3, 1)), np.array([4]), window=0)


# -- the reader ------------------------------------------------------------------------
def reader(env, name="det_a", packing="first_fit", host_index=0, host_count=1, batch=8, window=16, pack=True, **kwargs):
    data_dir, cache_dir, registry = env
    if packing is not None:
        kwargs.update(packing=packing, packing_window=window)
    return DeterministicReader(
        name,
        cache_dir,
        seed=7,
        global_batch_size=batch,
        sequence_length=det_run.det_tasks.LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=pack),
        host_index=host_index,
        host_count=host_count,
        registry=registry,
        **kwargs,
    )


def fill(batches, key="decoder_target_tokens"):
    return float(np.mean([(b[key] != 0).mean() for b in batches]))


def test_default_is_greedy(det_env):
    default = reader(det_env, packing=None)
    plan = default.streams[0].plan
    assert plan.order is None
    stream = default.streams[0]
    n = stream.cache.num_records  # the base order: the cache order under the chunk order
    ids = np.arange(n, dtype=np.int64) if stream.base is None else stream.base.range(0, n)
    units = default.converter.packing_units(stream.expected_lengths(ids), default.lengths)[0]
    # Under the chunk order no bin runs past a chunk of the cache (one per shard here: 150, 280).
    breaks = chunk_bounds(stream.cache.offsets, stream.cache.group_size)[1:] if stream.base is None else None
    greedy = plan_lib.greedy_bins(units, np.array([48, 16]), breaks=breaks)
    np.testing.assert_array_equal(plan.starts, greedy.starts)
    assert breaks is not None and breaks.tolist() == [150, 280] and 150 in plan.starts
    explicit = reader(det_env, packing="greedy")
    for step in (0, 5):
        assert det_run.digest(default.batch_at(step)) == det_run.digest(explicit.batch_at(step))
    assert "packing_window" not in default.get_state()


def test_reader_rows_are_fuller_and_every_record_is_read_once(det_env):
    greedy, first_fit = reader(det_env, packing="greedy"), reader(det_env)
    steps = range(6)
    assert fill([first_fit.batch_at(s) for s in steps]) > fill([greedy.batch_at(s) for s in steps])
    stream = first_fit.streams[0]
    assert stream.plan.num_bins < greedy.streams[0].plan.num_bins
    seen = []
    for s in range(-(-stream.plan.num_bins // 8)):
        seen += [i for _, e, ids in first_fit.row_records(s) if e == 0 for i in ids.tolist()]
    assert sorted(seen) == list(range(stream.cache.num_records))
    for i, (_, _, ids) in enumerate(first_fit.row_records(2)):  # converter: one row per bin
        assert first_fit.batch_at(2)["decoder_segment_ids"][i].max() == len(ids)


@pytest.mark.parametrize("name", ["det_mix"])  # a mixture: each of its tasks is a stream as det_a alone
def test_deterministic_and_resumable_mid_epoch(det_env, name):
    run = reader(det_env, name)  # the default prefetch and steps_per_call
    saved, digests = {}, []
    for step in range(20):
        if step in (0, 7, 13):
            saved[step] = dict(run.get_state())
        digests.append(det_run.digest(next(run)))
    run.close()
    # Other readers computing 4 steps at a time, nothing ahead: the same batches.
    again = reader(det_env, name, prefetch=0, steps_per_call=4)
    assert [det_run.digest(next(again)) for _ in range(20)] == digests
    for k, state in saved.items():
        assert state["packing_window"] == 16
        fresh = reader(det_env, name, prefetch=0, steps_per_call=4)
        fresh.set_state(state)
        assert [det_run.digest(next(fresh)) for _ in range(4)] == digests[k : k + 4], k


def test_state_of_another_packing_is_refused(det_env):
    state = reader(det_env).get_state()
    with pytest.raises(DataTasksError, match="packing='first_fit', packing_window=16.*packing='greedy'"):
        reader(det_env, packing="greedy").set_state(state)
    with pytest.raises(DataTasksError, match="packing_window=32"):
        reader(det_env, window=32).set_state(state)
    with pytest.raises(DataTasksError, match="saved by a reader with packing='greedy'"):
        reader(det_env).set_state({"step": 3, "seed": 7, "global_batch_size": 8})


@pytest.mark.parametrize("name", ["det_a", "det_mix"])
def test_same_global_batch_on_one_and_two_hosts(det_env, name):
    one = reader(det_env, name)
    two = [reader(det_env, name, host_index=h, host_count=2) for h in range(2)]
    for step in (0, 3, 40):  # 40: past the first epoch of det_a
        full = one.batch_at(step)
        parts = [r.batch_at(step) for r in two]
        for k, v in full.items():
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), v, err_msg=k)


def test_reader_refuses_bad_packing_options(det_env):
    with pytest.raises(DataTasksError, match="unknown packing 'first-fit'"):
        reader(det_env, packing="first-fit")
    with pytest.raises(DataTasksError, match="pack=False"):
        reader(det_env, pack=False)
    with pytest.raises(DataTasksError, match="packing_window must be a positive integer"):
        reader(det_env, window=0)
