"""DeterministicReader: restore at any step, host-count independence, epochs, seeds."""

import pathlib

import det_run
import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic import DeterministicReader
from cairn.datatasks.errors import DataTasksError
from cairn.tokenizers import ByteVocabulary


def make_reader(env, name, pack, host_index=0, host_count=1, batch=4, seed=7, **kwargs):
    data_dir, cache_dir, registry = env
    return DeterministicReader(
        name,
        cache_dir,
        seed=seed,
        global_batch_size=batch,
        sequence_length=det_run.det_tasks.LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=pack),
        host_index=host_index,
        host_count=host_count,
        registry=registry,
        **kwargs,
    )


@pytest.fixture(scope="module")
def shared(det_env):
    """`shared(name, pack, ...)`: a reader read only through `batch_at` / `row_records`, which
    never move its state, so tests share it (each new reader sets up its stages again)."""
    made = {}

    def get(name, pack, host_index=0, host_count=1, batch=4, seed=7):
        key = (name, pack, host_index, host_count, batch, seed)
        if key not in made:
            made[key] = make_reader(det_env, *key, prefetch=0)
        return made[key]

    yield get
    for reader in made.values():
        reader.close()


@pytest.fixture(scope="module")
def mix_digests(shared):
    """Digests of det_mix's packed global batches 0..40 (batch 4, seed 7), computed in one pass:
    what every way of reading that stream must give."""
    return [det_run.digest(b) for b in shared("det_mix", True).batches_at(0, 41)]


@pytest.mark.parametrize("name", ["det_a", "det_mix"])
@pytest.mark.parametrize("pack", [True, False])
def test_hosts_concatenate_to_the_global_batch(shared, name, pack):
    one = shared(name, pack, batch=8)
    # 4 hosts of 2 rows each (a host's rows are a slice of the global batch, the same code for
    # any host count; 2 hosts: first_fit_test::test_same_global_batch_on_one_and_two_hosts).
    for hosts in (4,):
        readers = [shared(name, pack, h, hosts, batch=8) for h in range(hosts)]
        for step in (0, 3, 57):  # 57: past the first epoch of det_b and det_a unpacked
            full = one.batch_at(step)
            parts = [r.batch_at(step) for r in readers]
            for k, v in full.items():
                np.testing.assert_array_equal(
                    np.concatenate([p[k] for p in parts]), v, err_msg=f"{name} pack={pack} hosts={hosts} {k}"
                )
                assert v.shape[0] == 8


def test_restore_gives_the_same_following_batches(det_env, mix_digests):
    run = make_reader(det_env, "det_mix", True)  # the default prefetch and steps_per_call
    saved, digests = {}, []
    for step in range(21):
        if step in (0, 1, 17):
            saved[step] = dict(run.get_state())
        digests.append(det_run.digest(next(run)))
    run.close()
    assert digests == mix_digests[:21]  # next() gives the batches of (seed, step)
    for k, state in saved.items():
        # A fresh reader, computing other chunks (3 steps, nothing ahead): the same batches.
        fresh = make_reader(det_env, "det_mix", True, prefetch=0, steps_per_call=3)
        fresh.set_state(state)
        assert [det_run.digest(next(fresh)) for _ in range(3)] == digests[k : k + 3], k
    with pytest.raises(DataTasksError, match="seed=8"):
        run.set_state({"step": 3, "seed": 8, "global_batch_size": 4})


def test_state_is_the_row_index_and_the_position(det_env):
    """Each stage that holds state gives its own: the row index what shapes its rows (no
    position), batching the step; the reader's state is the two, as checkpoints hold it. A
    state of other rows is refused by the index before the position moves."""
    run = make_reader(det_env, "det_a", True, packing="first_fit", packing_window=16, prefetch=0)
    next(run)
    index = run.index.get_state()
    assert "step" not in index and index["seed"] == 7 and index["packing_window"] == 16
    assert run.get_state() == {"step": 1, **index} and list(run.get_state())[0] == "step"
    run.index.set_state(index)  # its own state: accepted, nothing moves
    with pytest.raises(DataTasksError, match="packing='greedy'"):
        run.set_state({"step": 5, "seed": 7, "global_batch_size": 4})
    assert run.get_state()["step"] == 1
    run.set_state({**run.get_state(), "step": 5})
    assert run.get_state() == {"step": 5, **index}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_set_state_keeps_the_chunks_of_the_new_position(det_env, mix_digests, prefetch, monkeypatch):
    """A peek (get_state, next, set_state) and a jump back within reach reuse the chunks already
    computed; a far jump drops them. Batches are the same either way."""
    reader = make_reader(det_env, "det_mix", True)
    reader._prefetch = prefetch
    reader.steps_per_call = 4
    computed = []
    chunk = reader._chunk
    monkeypatch.setattr(reader, "_chunk", lambda c: computed.append(c) or chunk(c))
    want = mix_digests

    state = dict(reader.get_state())
    first = next(reader)
    first["extra"] = 1  # a consumer's change to a batch dict does not reach the next reader
    reader.set_state(state)
    got = [next(reader) for _ in range(6)]
    assert "extra" not in got[0]
    assert [det_run.digest(b) for b in got] == want[:6]
    reader.close()  # waits for the prefetch threads
    assert computed.count(0) == 1 and computed.count(1) == 1, computed

    reader.set_state({**state, "step": 36})  # far ahead: nothing kept, chunk 9 computed afresh
    assert det_run.digest(next(reader)) == want[36]
    reader.close()
    assert computed.count(9) == 1 and (prefetch == 0 or 0 not in reader._ahead)


def test_prefetch_stops_at_prefetch_until(det_env, mix_digests):
    reader = make_reader(det_env, "det_mix", True)
    reader._prefetch_until, reader.steps_per_call = 6, 4  # chunks 0 (steps 0-3), 1 (4-7), 2 (8-11)
    want = mix_digests[:13]
    assert det_run.digest(next(reader)) == want[0]
    assert sorted(reader._ahead) == [0, 1]  # chunk 2 starts at step 8 >= 6: not computed ahead
    assert [det_run.digest(next(reader)) for _ in range(12)] == want[1:]  # reading past it works
    reader.close()


@pytest.mark.parametrize("pack", [True, False])
def test_each_epoch_visits_every_record_once(shared, pack):
    r = shared("det_b", pack)
    n = r.streams[0].cache.num_records
    bins = r.streams[0].plan.num_bins
    seen: dict = {}
    step = 0
    while len(seen.get(1, [])) < n or step * 4 < 2 * bins:
        for _, epoch, ids in r.row_records(step):
            seen.setdefault(epoch, []).extend(ids.tolist())
        step += 1
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(n)), epoch
    if pack:
        assert bins < n  # rows hold several examples
    assert r.row_records(0) != r.row_records(bins // 4 + 1)


def test_packed_rows_respect_the_plan(shared):
    r = shared("det_a", True, batch=8)
    batch = r.batch_at(5)
    rows = r.row_records(5)
    for i, (_, _, ids) in enumerate(rows):
        assert batch["encoder_segment_ids"][i].max() == len(ids)
        assert batch["decoder_segment_ids"][i].max() == len(ids)
    assert (batch["decoder_target_tokens"] > 0).sum() > 8 * 16 * 0.6  # well packed


def test_post_cache_noise_is_seeded_per_seed_epoch_and_record(det_env, shared):
    a = shared("det_b", False)
    b = make_reader(det_env, "det_b", False, seed=7)  # another reader of the same seed
    c = shared("det_b", False, seed=8)
    first = a.batch_at(0)
    np.testing.assert_array_equal(first["encoder_input_tokens"], b.batch_at(0)["encoder_input_tokens"])
    assert not np.array_equal(first["encoder_input_tokens"], c.batch_at(0)["encoder_input_tokens"])
    # The same record in two epochs gets different noise.
    n = a.streams[0].cache.num_records
    rec = a.row_records(0)[0][2][0]
    later = next(s for s in range(n // 4, 3 * n // 4 + 2) for _, e, ids in a.row_records(s) if e == 1 and ids[0] == rec)
    row = [i for i, (_, e, ids) in enumerate(a.row_records(later)) if ids[0] == rec][0]
    x0, x1 = first["encoder_input_tokens"][0], a.batch_at(later)["encoder_input_tokens"][row]
    assert not np.array_equal(x0, x1)
    assert np.count_nonzero(x0) == np.count_nonzero(x1)


def test_mixture_rates(shared):
    r = shared("det_mix", False, batch=64)
    names = [name for s in range(20) for name, _, _ in r.row_records(s)]
    share = names.count("det_a") / len(names)
    assert abs(share - 2 / 3) < 0.05, share


def test_bad_arguments(det_env):
    with pytest.raises(DataTasksError, match="multiple of host_count 3"):
        make_reader(det_env, "det_a", True, 0, 3, batch=8)
    with pytest.raises(DataTasksError, match="host_index"):
        make_reader(det_env, "det_a", True, 4, 4, batch=8)


@pytest.mark.parametrize("eos_after_cache", [True, False])
def test_rows_hold_the_cached_tokens(det_env, tmp_path, eos_after_cache):
    """Content, not only consistency: unpacked rows are the cached ids, trimmed, with EOS."""
    import os

    from cairn.datatasks.deterministic import CachedTask, cache_task_in_process, record_stage, task_dir

    data_dir = det_env[0]
    source = dt.TextLineDataSource({"train": os.path.join(data_dir, "b*.txt")})
    vocab = ByteVocabulary()
    eos = dt.preprocessors.append_eos_after_trim if eos_after_cache else dt.preprocessors.append_eos
    task = dt.Task(
        "det_c",
        source,
        {"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)},
        [det_run.det_tasks.halves, dt.preprocessors.tokenize, eos],
    )
    assert len(task.cacheable_preprocessors) == (2 if eos_after_cache else 3)
    path = task_dir(str(tmp_path), "det_c", "train")
    cache_task_in_process(task, "train", path)
    lengths = {"inputs": 12, "targets": 6}
    reader = DeterministicReader(
        task,
        str(tmp_path),
        seed=3,
        global_batch_size=6,
        sequence_length=lengths,
        feature_converter=dt.EncDecFeatureConverter(pack=False),
        prefetch=0,
    )
    cache = CachedTask(path)
    for step in (0, 9):
        batch = reader.batch_at(step)
        for row, (_, _, ids) in enumerate(reader.row_records(step)):
            ex = record_stage.parse(cache.read(ids)[0], cache.specs)
            for k, out in (("inputs", "encoder_input_tokens"), ("targets", "decoder_target_tokens")):
                want = list(ex[k])
                if eos_after_cache:
                    want = want[: lengths[k] - 1] + [1]
                want = want[: lengths[k]]
                got = batch[out][row]
                assert got[: len(want)].tolist() == want and not got[len(want) :].any(), (k, row)
    # prefetch does not change the batches
    fast = DeterministicReader(
        task,
        str(tmp_path),
        seed=3,
        global_batch_size=6,
        sequence_length=lengths,
        feature_converter=dt.EncDecFeatureConverter(pack=True),
    )
    slow = DeterministicReader(
        task,
        str(tmp_path),
        seed=3,
        global_batch_size=6,
        sequence_length=lengths,
        feature_converter=dt.EncDecFeatureConverter(pack=True),
        prefetch=0,
    )
    for _ in range(4):
        a, b = next(fast), next(slow)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    fast.close()


def test_prefix_lm_packed_rows_follow_the_plan(det_env):
    data_dir, cache_dir, registry = det_env

    def make(h, n):
        return DeterministicReader(
            "det_b",
            cache_dir,
            seed=2,
            global_batch_size=4,
            sequence_length={"inputs": 20, "targets": 12},
            feature_converter=dt.PrefixLMFeatureConverter(pack=True),
            host_index=h,
            host_count=n,
            registry=registry,
            prefetch=0,
        )

    one, halves = make(0, 1), [make(0, 2), make(1, 2)]
    full = one.batch_at(3)
    for k, v in full.items():
        np.testing.assert_array_equal(np.concatenate([r.batch_at(3)[k] for r in halves]), v)
    assert full["decoder_target_tokens"].shape == (4, 32)
    for i, (_, _, ids) in enumerate(one.row_records(3)):
        assert full["decoder_segment_ids"][i].max() == len(ids)


# -- shuffle="chunks": a read order with locality (chunk_order.py) ----------------------------
CHUNKED = {"shuffle": "chunks", "shuffle_chunk": 8, "shuffle_window": 2}


@pytest.fixture(scope="module")
def chunked(det_env):
    """`chunked(name, pack, ...)`: shared readers in chunk order (8 records a chunk, windows of
    2 chunks), read only through `batch_at` / `row_records`."""
    made = {}

    def get(name, pack, host_index=0, host_count=1, batch=8, seed=7, **kwargs):
        key = (name, pack, host_index, host_count, batch, seed, tuple(sorted(kwargs.items())))
        if key not in made:
            options = {**CHUNKED, **kwargs}
            made[key] = make_reader(det_env, name, pack, host_index, host_count, batch, seed, prefetch=0, **options)
        return made[key]

    yield get
    for reader in made.values():
        reader.close()


def chunks_of(reader, rows):
    """The set of (task, chunk of 8 records) that the records of `rows` lie in."""
    from cairn.datatasks.deterministic.chunk_order import chunk_bounds

    bounds = {s.task.name: chunk_bounds(s.cache.offsets, 8) for s in reader.streams}
    return {(name, int(c)) for name, _, ids in rows for c in np.searchsorted(bounds[name], ids, side="right") - 1}


@pytest.mark.parametrize(
    "name,pack,packing", [("det_a", False, "greedy"), ("det_mix", True, "greedy"), ("det_a", True, "first_fit")]
)
def test_chunk_order_is_elastic_and_every_epoch_visits_every_row_once(chunked, name, pack, packing):
    opts = {"packing": packing, "packing_window": 16} if packing == "first_fit" else {}
    one = chunked(name, pack, **opts)
    for hosts in (2, 4):
        readers = [chunked(name, pack, h, hosts, **opts) for h in range(hosts)]
        for step in (0, 3, 57):
            parts = [row for r in readers for row in r.row_records(step)]
            assert [(n, e, ids.tolist()) for n, e, ids in parts] == [
                (n, e, ids.tolist()) for n, e, ids in one.row_records(step)
            ], (hosts, step)
    # Every record once per epoch, task by task (det_b has ~90 records, det_a ~280).
    seen: dict = {}
    for step in range(80):
        for task, epoch, ids in one.row_records(step):
            seen.setdefault((task, epoch), []).extend(ids.tolist())
    for s in one.streams:
        assert sorted(seen[(s.task.name, 0)]) == list(range(s.cache.num_records)), s.task.name
        assert s.base is None and s.order.chunks is not None


def test_chunk_order_batches_read_few_chunks_and_global_reads_many(chunked, shared):
    steps = range(30)
    local = [len(chunks_of(chunked("det_a", False), chunked("det_a", False).row_records(s))) for s in steps]
    spread = [
        len(chunks_of(shared("det_a", False, batch=8), shared("det_a", False, batch=8).row_records(s))) for s in steps
    ]
    # A batch of 8 rows lies in at most two windows of 2 chunks; a global batch of 8 in ~7 of 35.
    assert max(local) <= 4 and np.mean(spread) > 6, (local, spread)
    packed = chunked("det_a", True)
    first = [[(n, e, ids[:1]) for n, e, ids in packed.row_records(s)] for s in steps]
    assert max(len(chunks_of(packed, rows)) for rows in first) <= 4


def test_chunk_order_is_seeded_and_its_plan_is_not(chunked):
    a, b = chunked("det_a", True), chunked("det_a", True, seed=8)
    np.testing.assert_array_equal(a.streams[0].plan.starts, b.streams[0].plan.starts)
    rows = [[ids.tolist() for _, _, ids in r.row_records(0, 10)] for r in (a, b)]
    assert rows[0] != rows[1]
    assert rows[0] == [ids.tolist() for _, _, ids in chunked("det_a", True).row_records(0, 10)]


def test_global_order_keeps_todays_rows(shared, det_env):
    """shuffle="global" (the default on unchunked caches) keeps its rows: pinned here, so a change
    to the global order shows. The shared caches are chunked, so their default is "chunks"."""
    explicit = make_reader(det_env, "det_mix", True, prefetch=0, shuffle="global")
    rows = explicit.row_records(0) + explicit.row_records(40)
    want = [("b", [82]), ("a", [22]), ("b", [88]), ("a", [57]), ("b", [45]), ("a", [246]), ("b", [86]), ("a", [143])]
    assert [(n[-1], ids.tolist()) for n, _, ids in rows] == want
    unpacked = make_reader(det_env, "det_mix", False, prefetch=0, shuffle="global")
    assert [ids.tolist() for _, _, ids in unpacked.row_records(40)] == [[34], [66], [45], [101]]
    assert all(s.order.chunks is None for s in explicit.streams) and "shuffle" not in explicit.get_state()
    assert shared("det_mix", True).orders == [("chunks", 512), ("chunks", 512)]
    explicit.close()
    unpacked.close()


def test_chunk_order_seeks_restores_and_refuses_another_order(det_env, chunked):
    # The caches are chunked (format 3): "chunks" by default, here with order chunks of 8 records.
    run = make_reader(
        det_env, "det_mix", True, batch=8, shuffle_chunk=8, shuffle_window=2, prefetch=1, steps_per_call=4
    )
    assert run.orders == [("chunks", 8), ("chunks", 8)]
    got = []
    for _ in range(7):
        state = run.get_state()
        got.append(next(run))
    run.close()
    assert state == {"step": 6, "seed": 7, "global_batch_size": 8, **CHUNKED}
    # A seek equals iterating, and equals the explicitly chunked reader's batches.
    want = chunked("det_mix", True).batches_at(0, 7)
    for a, b in zip(got, want):
        assert det_run.digest(a) == det_run.digest(b)
    halves = [chunked("det_mix", True, h, 2).batch_at(5) for h in (0, 1)]
    assert det_run.digest({k: np.concatenate([h[k] for h in halves]) for k in want[5]}) == det_run.digest(want[5])
    fresh = make_reader(det_env, "det_mix", True, batch=8, prefetch=0, steps_per_call=2, **CHUNKED)
    fresh.set_state(state)
    assert det_run.digest(next(fresh)) == det_run.digest(got[6])
    with pytest.raises(DataTasksError, match="shuffle_window=2.*shuffle_window=64"):
        make_reader(det_env, "det_mix", True, batch=8, shuffle="chunks").set_state(state)
    with pytest.raises(DataTasksError, match="shuffle='chunks'.*shuffle='global'"):
        make_reader(det_env, "det_mix", True, batch=8, shuffle="global").set_state(state)
    for bad, match in (
        ({"shuffle": "local"}, "unknown shuffle 'local'"),
        ({"shuffle_window": 0}, "shuffle_window must be a positive integer, got 0"),
        ({"shuffle": "global", "shuffle_chunk": 8}, "needs shuffle='chunks'"),
    ):
        with pytest.raises(DataTasksError, match=match):
            make_reader(det_env, "det_a", True, **bad)


def test_chunk_order_sorts_batch_rows_so_a_host_reads_few_chunks(chunked):
    """One host of 4 reads about a quarter of each batch's chunks, because the rows of a global
    batch are sorted by first record; unsorted, its 4 rows spread over the window's chunks."""
    host, whole = chunked("det_a", False, 0, 4, batch=16), chunked("det_a", False, batch=16)
    sorted_rows = [len(chunks_of(host, host.row_records(s))) for s in range(16)]
    host.sorted_rows = False
    unsorted = [len(chunks_of(host, host.row_records(s))) for s in range(16)]
    host.sorted_rows = True
    assert np.mean(sorted_rows) <= 1.5 and np.mean(unsorted) >= 1.7, (sorted_rows, unsorted)
    rows = [
        (ids.tolist(), sorted_ids.tolist())
        for (_, _, ids), (_, _, sorted_ids) in zip(
            whole.row_records(3), sorted(whole.row_records(3), key=lambda r: r[2][0])
        )
    ]
    assert all(a == b for a, b in rows)  # a batch's rows are in record order


def test_a_pass_looks_up_its_rows_bins_once(det_env, monkeypatch):
    """A pass sorts its global batches' rows by first record, then reads its own share: the
    bins of those positions are computed once (ReadOrder keeps the thread's last lookup), and
    the batches are those of a reader that computes them afresh at every lookup."""
    from cairn.datatasks.deterministic import read_order

    lookups = []
    original = read_order.ReadOrder.bins

    def counted(self, epoch, ks):
        lookups.append(len(ks))
        return original(self, epoch, ks)

    monkeypatch.setattr(read_order.ReadOrder, "bins", counted)
    reader = make_reader(det_env, "det_a", True, 1, 2, 8, 7, prefetch=0, steps_per_call=4, **CHUNKED)
    got = reader.batches_at(5, 4)
    assert sum(lookups) == 4 * 8  # the 4 global batches' rows (by epoch); this host's 16 came from them
    lookups.clear()
    monkeypatch.setattr(read_order.ReadOrder, "_bounds", uncached_bounds)
    fresh = make_reader(det_env, "det_a", True, 1, 2, 8, 7, prefetch=0, steps_per_call=4, **CHUNKED)
    want = fresh.batches_at(5, 4)
    assert sum(lookups) == 4 * 8 + 4 * 4  # afresh: the host's share looked up again
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    reader.close()
    fresh.close()


def uncached_bounds(self, cursors, epochs, ks):
    """`ReadOrder._bounds` without the kept lookup (the reference for the test above)."""
    starts, ends = np.empty_like(cursors), np.empty_like(cursors)
    for e in np.unique(epochs):
        where = np.nonzero(epochs == e)[0]
        starts[where], ends[where] = self.plan.bins(self.bins(int(e), ks[where]))
    return starts, ends


def test_a_packed_plan_is_built_once_beside_the_cache_and_mapped_after(det_env, monkeypatch, capfd):
    """The first packed reader builds and stores each task's plan (`<cache>/plans/`), under a
    lock; later readers memory-map it. The batches are those of a reader that keeps its plan in
    memory; other sequence lengths, seeds under the global order, or a damaged plan file get a
    plan of their own; a lock held by a live process is waited for, a stale one taken over; an
    unwritable cache keeps the plan in memory with a one-line notice."""
    import json as json_lib

    from cairn.datatasks.deterministic import plan_store

    plans = pathlib.Path(det_env[1]) / "det_a" / "train" / plan_store.PLANS
    fresh = make_reader(det_env, "det_a", True, prefetch=0, seed=3)
    first = fresh.streams[0]
    assert first.plan_source in ("built", "stored")  # another test may have stored it already
    again = make_reader(det_env, "det_a", True, prefetch=0, seed=3).streams[0]
    assert again.plan_source == "stored" and isinstance(again.plan.starts, np.memmap)
    np.testing.assert_array_equal(again.plan.starts, first.plan.starts)
    memory = make_reader(det_env, "det_a", True, prefetch=0, seed=3, store_plan=False)
    assert memory.streams[0].plan_source == "memory"
    np.testing.assert_array_equal(memory.streams[0].plan.starts, first.plan.starts)
    assert det_run.digest(fresh.batch_at(2)) == det_run.digest(memory.batch_at(2))
    # The chunk order's plan does not depend on the seed; the global order's does.
    keys = {p.name for p in plans.glob("*.json")}
    make_reader(det_env, "det_a", True, prefetch=0, seed=4)
    assert {p.name for p in plans.glob("*.json")} == keys
    make_reader(det_env, "det_a", True, prefetch=0, seed=4, shuffle="global")
    make_reader(det_env, "det_a", True, prefetch=0, seed=5, shuffle="global")
    assert len({p.name for p in plans.glob("*.json")} - keys) == 2
    assert not list(plans.glob("*.lock"))
    # A damaged array (truncated) is not read: the plan is built and written again.
    key = first.plan_key
    record = json_lib.loads((plans / f"{key}.json").read_text())
    starts = plans / record["arrays"]["starts"]["file"]
    saved = starts.read_bytes()
    cut = plans / "cut.npy"
    cut.write_bytes(saved[:-8])
    cut.replace(starts)  # a new file: the readers' maps of the old one stay valid
    cache = again.cache
    assert plan_store.load_or_build(cache, key, lambda: first.plan)[1] == "built"
    assert starts.read_bytes() == saved
    # A lock: a live holder is waited for (here not long), a stale one is taken over.
    other = "0" * 64
    lock = plans / f"{other}.lock"
    lock.write_text(json_lib.dumps({"host": "h", "pid": 1, "time": __import__("time").time()}))
    monkeypatch.setattr(plan_store, "WAIT_S", 0.6)
    monkeypatch.setattr(plan_store, "POLL_S", 0.2)
    assert plan_store.load_or_build(cache, other, lambda: first.plan)[1] == "memory"
    lock.write_text(json_lib.dumps({"host": "h", "pid": 1, "time": 0.0}))
    plan, how = plan_store.load_or_build(cache, other, lambda: first.plan)
    assert how == "built" and not lock.exists()
    np.testing.assert_array_equal(plan.starts, first.plan.starts)

    def refuse(path, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plan_store.storage, "create_exclusive", refuse)
    capfd.readouterr()
    assert plan_store.load_or_build(cache, "1" * 64, lambda: first.plan)[1] == "memory"
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cairn: packing plan kept in memory: cannot write under")
    for r in (fresh, memory):
        r.close()
