"""Grain interop: a deterministic pipeline as a Grain source (batches equal to the reader's,
Grain's iterator state, host sharding) and Grain data as a Cairn source (streaming, the cache)."""

import os
import pickle
import subprocess
import sys

import cloudpickle
import grain
import numpy as np
import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks.deterministic import (
    CachedTask,
    CacheMismatchError,
    DeterministicReader,
    cache_task_in_process,
    task_dir,
)
from cairn.tokenizers import ByteVocabulary

VOCAB = ByteVocabulary()
LENGTHS = {"inputs": 24, "targets": 12}
WORDS = ["oak", "ash", "elm", "yew", "fir", "box", "bay"]


def _lines(salt: int, n: int) -> list:
    return [
        " ".join(WORDS[(i * 3 + j + salt) % len(WORDS)] for j in range(i % 5 + 1)) + f" {salt}.{i}" for i in range(n)
    ]


def _split(ds):
    return ds.map(lambda s: {"inputs": s, "targets": tf.strings.substr(s, 0, 9)})


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """`(cache_dir, registry)`: tasks g_a and g_b (text lines) cached, and the mixture g_mix."""
    root = tmp_path_factory.mktemp("grain")
    registry = dt.Registry()
    feats = {"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)}
    for name, salt, n in (("g_a", 0, 70), ("g_b", 1, 40)):
        path = root / f"{name}.txt"
        path.write_text("\n".join(_lines(salt, n)) + "\n")
        source = dt.TextLineDataSource({"train": str(path)})
        task = registry.add_task(dt.Task(name, source, feats, [_split, pp.tokenize, pp.append_eos_after_trim]))
        cache_task_in_process(task, "train", task_dir(str(root / "cache"), name, "train"))
    registry.add_mixture(dt.Mixture("g_mix", [("g_a", 2.0), ("g_b", 1.0)], registry=registry))
    return str(root / "cache"), registry


def _args(env, name="g_mix", pack=True, batch=4, seed=5):
    cache_dir, registry = env
    converter = dt.EncDecFeatureConverter(pack=pack)
    return dict(
        mixture_or_task=name,
        cache_dir=cache_dir,
        seed=seed,
        global_batch_size=batch,
        sequence_length=LENGTHS,
        feature_converter=converter,
        registry=registry,
    )


def _reader(env, host_index=0, host_count=1, **kw):
    return DeterministicReader(**_args(env, **kw), host_index=host_index, host_count=host_count)


def _assert_batches_equal(got, want, what=""):
    assert len(got) == len(want), what
    for step, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), what
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=f"{what} step {step} {k}")


def _loader(source, rows, shard_options=None):
    sampler = grain.samplers.IndexSampler(len(source), shard_options=grain.sharding.NoSharding(), num_epochs=1)
    return grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.transforms.Batch(rows)])


@pytest.mark.parametrize("pack", [True, False])
def test_data_loader_batches_equal_the_readers(env, pack):
    reader = _reader(env, pack=pack)
    want = [next(reader) for _ in range(7)]
    source = dt.as_grain_source(**_args(env, pack=pack), num_steps=7)
    assert len(source) == 7 * 4
    got = list(_loader(source, 4))  # Grain's default ReadOptions: 16 reader threads
    _assert_batches_equal(got, want, f"pack={pack}")
    assert not np.array_equal(got[0]["decoder_target_tokens"], got[1]["decoder_target_tokens"])


def test_map_dataset_rows_and_batches_equal_the_readers(env):
    reader = _reader(env, name="g_a")
    want = [reader.batch_at(s) for s in range(5)]
    rows = dt.as_grain_dataset(**_args(env, name="g_a"), num_steps=5)
    assert isinstance(rows, grain.MapDataset) and len(rows) == 20
    _assert_batches_equal(list(rows.batch(4)), want, "rows.batch(4)")
    batches = dt.as_grain_dataset(**_args(env, name="g_a"), num_steps=5, element="batch")
    assert len(batches) == 5
    _assert_batches_equal([batches[s] for s in (4, 0, 2)], [want[4], want[0], want[2]], "element=batch")
    assert batches[-1]["encoder_input_tokens"].shape == (4, LENGTHS["inputs"])


def test_data_loader_iterator_state_resumes_identically(env):
    source = dt.as_grain_source(**_args(env), num_steps=9)
    it = iter(_loader(source, 4))
    for _ in range(3):
        next(it)
    state = it.get_state()
    rest = list(it)
    assert len(rest) == 6
    resumed = iter(_loader(dt.as_grain_source(**_args(env), num_steps=9), 4))
    resumed.set_state(state)
    _assert_batches_equal(list(resumed), rest, "restored DataLoader iterator")
    _assert_batches_equal(rest[:2], [_reader(env).batch_at(s) for s in (3, 4)], "against the reader")


def test_dataset_iterator_state_resumes_identically(env):
    ds = dt.as_grain_dataset(**_args(env, pack=False), num_steps=6).batch(4).to_iter_dataset()
    it = iter(ds)
    next(it), next(it)
    state = it.get_state()
    rest = list(it)
    again = iter(ds)
    again.set_state(state)
    _assert_batches_equal(list(again), rest, "restored DatasetIterator")
    reader = _reader(env, pack=False)
    reader.set_state({**reader.get_state(), "step": 2})
    _assert_batches_equal(rest, [next(reader) for _ in range(4)], "against the reader resumed at step 2")


@pytest.mark.parametrize("hosts", [2, 4])
def test_shard_options_give_each_host_its_rows_of_the_global_batch(env, hosts):
    steps = 4
    full = [_reader(env, batch=8).batch_at(s) for s in range(steps)]
    per_host = []
    for h in range(hosts):
        options = grain.sharding.ShardOptions(shard_index=h, shard_count=hosts, drop_remainder=True)
        source = dt.as_grain_source(**_args(env, batch=8), num_steps=steps, shard_options=options)
        assert len(source) == steps * 8 // hosts
        per_host.append(list(_loader(source, 8 // hosts)))
        mine = _reader(env, h, hosts, batch=8)
        _assert_batches_equal(per_host[-1], [mine.batch_at(s) for s in range(steps)], f"host {h} of {hosts}")
    for s in range(steps):
        for k, v in full[s].items():
            np.testing.assert_array_equal(np.concatenate([p[s][k] for p in per_host]), v, err_msg=f"step {s} {k}")


def test_shard_by_jax_process_is_this_process_share(env):
    source = dt.as_grain_source(**_args(env), num_steps=3, shard_options=grain.sharding.ShardByJaxProcess())
    assert (source.host_index, source.host_count) == (0, 1) and len(source) == 12
    _assert_batches_equal(list(_loader(source, 4)), [_reader(env).batch_at(s) for s in range(3)], "ShardByJaxProcess")


@pytest.mark.parametrize("name", ["g_b", "g_mix"])
def test_source_pickles_without_its_reader(env, name):
    """Grain sends a source to its worker processes with cloudpickle; a mixture takes its
    registry along (without the registry's lock)."""
    source = dt.as_grain_source(**_args(env, name=name, pack=False), num_steps=4)
    want = source[9]
    copy = cloudpickle.loads(cloudpickle.dumps(source))
    assert copy._reader is None  # each process opens its own
    got = copy[9]
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    got["decoder_target_tokens"][:] = 0  # a copy: the source's own rows are unchanged
    assert copy[9]["decoder_target_tokens"].any()
    copy.close()
    assert pickle.loads(pickle.dumps(dt.DEFAULT_REGISTRY)) is dt.DEFAULT_REGISTRY


def test_worker_processes_give_the_readers_batches(tmp_path):
    """Grain's worker processes (spawned; the source sent with cloudpickle, its task pickled
    by value) read whole batches (`element="batch"`), which Grain hands out in step order.
    The task reads Grain data too, so a worker needs no TensorFlow (the NumPy path)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain reads its absl flags in the workers' set-up
        flags.FLAGS.mark_as_parsed()
    lines = _lines(2, 40)
    data = grain.MapDataset.source(lines).map(lambda s: {"inputs": s, "targets": s[:9]})
    feats = {"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)}
    task = dt.Task("g_w", dt.GrainDataSource({"train": data}), feats, [pp.tokenize, pp.append_eos_after_trim])
    cache_task_in_process(task, "train", task_dir(str(tmp_path), "g_w", "train"))
    args = dict(
        mixture_or_task=task, cache_dir=str(tmp_path), seed=1, global_batch_size=4, sequence_length=LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=True),
    )  # fmt: skip
    reader = DeterministicReader(**args)
    want = [next(reader) for _ in range(12)]
    source = dt.as_grain_source(**args, num_steps=12, element="batch")
    sampler = grain.samplers.IndexSampler(len(source), shard_options=grain.sharding.NoSharding(), num_epochs=1)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=2)
    _assert_batches_equal(list(loader), want, "worker_count=2")


def test_bad_source_arguments_are_one_line_errors(env):
    cases = [
        (dict(num_steps=0), "num_steps must be a positive integer"),
        (dict(num_steps=2, element="example"), "element must be one of ('row', 'batch')"),
        (dict(num_steps=2, host_index=1), "unknown reader option(s) ['host_index']"),
        (dict(num_steps=2, shard_options=(0, 2)), "shard_options must be a grain ShardOptions"),
        (dict(num_steps=2, shard_options=grain.sharding.ShardOptions(0, 3)), "multiple of host_count 3"),
    ]
    for extra, message in cases:
        with pytest.raises(dt.DataTasksError) as e:
            dt.as_grain_source(**_args(env), **extra)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    source = dt.as_grain_source(**_args(env), num_steps=2)
    with pytest.raises(IndexError, match="index 8 is out of range for a source of 8 rows"):
        source[8]
    with pytest.raises(TypeError, match="must be an integer"):
        source["3"]
    np.testing.assert_array_equal(source[-1]["decoder_target_tokens"], source[7]["decoder_target_tokens"])


def test_grain_is_imported_only_when_used(monkeypatch):
    code = "import sys, cairn.datatasks; print('grain' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]
    monkeypatch.setitem(sys.modules, "grain", None)  # as if not installed
    with pytest.raises(dt.DataTasksError, match=r"pip install 'cairn-datatasks\[grain\]'"):
        dt.as_grain_dataset(mixture_or_task="x", cache_dir="/nonexistent")


# -- GrainDataSource: Grain data as a Cairn source ------------------------------------------

TEXTS = [f"{WORDS[i % 7]} {WORDS[(i * 2) % 7]} line {i}" for i in range(30)]


def _grain_texts(texts=TEXTS):
    """Text elements as dicts; every fifth line filtered out (Grain leaves None there)."""
    return grain.MapDataset.source(texts).map(lambda s: {"text": s, "n": _number(s)}).filter(lambda x: x["n"] % 5)


def _number(text):
    return int(text.rsplit(" ", 1)[1])


KEPT = [t for t in TEXTS if _number(t) % 5]


def _grain_task(data, name="g_src", num_shards=1, fingerprint=None):
    source = dt.GrainDataSource({"train": data}, num_shards=num_shards, fingerprint=fingerprint)
    return dt.Task(
        name,
        source,
        {"targets": dt.Feature(VOCAB)},
        [lambda ds: pp.rekey(ds, {"targets": "text"}), pp.tokenize, pp.append_eos],
    )


def _decoded(ds):
    return [VOCAB.decode(x["targets"]) for x in ds.as_numpy_iterator()]


def _texts(ds):
    return [x["text"].decode() for x in ds.as_numpy_iterator()]


def test_grain_data_source_streams_through_a_task(registry):
    task = registry.add_task(_grain_task(_grain_texts()))
    assert _decoded(task.get_dataset({"targets": 64}, "train", shuffle=False)) == KEPT
    shuffled = _texts(task.source.get_dataset("train", shuffle=True, seed=3))
    assert sorted(shuffled) == sorted(KEPT) and shuffled != KEPT
    assert shuffled == _texts(task.source.get_dataset("train", shuffle=True, seed=3))
    assert shuffled != _texts(task.source.get_dataset("train", shuffle=True, seed=4))
    rows = list(
        dt.get_dataset(
            "g_src", {"targets": 64}, dt.LMFeatureConverter(pack=False), shuffle=False, registry=registry, batch_size=4
        ).as_numpy_iterator()
    )
    assert [VOCAB.decode(r) for r in rows[0]["decoder_target_tokens"]] == KEPT[:4]


def test_grain_data_source_shards_are_contiguous_ranges():
    source = dt.GrainDataSource({"train": grain.MapDataset.range(10).map(lambda i: {"i": i})}, num_shards=3)
    assert source.list_shards("train") == [f"train-0000{k}-of-00003" for k in range(3)]
    parts = [
        [
            int(x["i"])
            for x in source.get_dataset("train", shuffle=False, shard_info=dt.ShardInfo(k, 3)).as_numpy_iterator()
        ]
        for k in range(3)
    ]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_grain_data_source_iterator_checkpoints(tmp_path):
    ds = _grain_task(_grain_texts()).source.get_dataset("train", shuffle=True, seed=1)
    it = iter(ds)
    next(it), next(it)
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.write(str(tmp_path / "it"))
    rest = [x["text"] for x in it]
    restored = iter(ds)
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    assert [x["text"] for x in restored] == rest and len(rest) > 3


def test_grain_data_source_feeds_the_cache(registry, tmp_path):
    task = registry.add_task(_grain_task(_grain_texts(), num_shards=2))
    path = task_dir(str(tmp_path), task.name, "train")
    cache_task_in_process(task, "train", path)
    cached = CachedTask(path, task, "train")
    assert cached.num_records == len(KEPT)
    reader = DeterministicReader(
        task, str(tmp_path), seed=0, global_batch_size=len(KEPT), sequence_length={"targets": 64},
        feature_converter=dt.LMFeatureConverter(pack=False),
    )  # fmt: skip
    assert sorted(VOCAB.decode(r) for r in next(reader)["decoder_target_tokens"]) == sorted(KEPT)
    changed = [TEXTS[0], "box" + TEXTS[1][3:]] + TEXTS[2:]  # the first element kept
    for other in (_grain_task(_grain_texts(changed)), _grain_task(_grain_texts(TEXTS + ["oak oak line 30"]))):
        with pytest.raises(CacheMismatchError, match="source"):
            CachedTask(path, other, "train")
    with pytest.raises(CacheMismatchError, match="source"):
        CachedTask(path, _grain_task(_grain_texts(), fingerprint="v2"), "train")


def test_grain_data_source_values_and_bad_input():
    plain = dt.GrainDataSource({"train": grain.MapDataset.source(["a", "bc"]), "ids": [np.arange(3), np.arange(5)]})
    assert list(plain.get_dataset("train", shuffle=False).as_numpy_iterator()) == [b"a", b"bc"]
    assert [x.tolist() for x in plain.get_dataset("ids", shuffle=False).as_numpy_iterator()] == [
        [0, 1, 2],
        [0, 1, 2, 3, 4],
    ]
    bad_init = [
        ({"train": grain.MapDataset.range(3).to_iter_dataset()}, "has no random access"),
        ({"train": grain.MapDataset.range(3).repeat()}, "is unbounded"),
        ({}, "at least one split"),
    ]
    for splits, message in bad_init:
        with pytest.raises(dt.DataTasksError, match=message):
            dt.GrainDataSource(splits)
    with pytest.raises(dt.DataTasksError, match="num_shards must be an int >= 1"):
        dt.GrainDataSource({"train": [1]}, num_shards=0)
    with pytest.raises(dt.DataTasksError, match="unknown split 'test'"):
        plain.get_dataset("test")
    with pytest.raises(dt.DataTasksError, match=r"split 'train' element 0 feature 'a' is a dict"):
        dt.GrainDataSource({"train": [{"a": {"b": 1}}]}).get_dataset("train")
    with pytest.raises(dt.DataTasksError, match=r"has no element \(all 2 are empty or filtered out\)"):
        dt.GrainDataSource({"train": grain.MapDataset.range(2).filter(lambda i: False)}).get_dataset("train")
    mixed = dt.GrainDataSource({"train": [{"a": np.int32(1)}, {"a": 1.5}]}).get_dataset("train", shuffle=False)
    with pytest.raises(
        tf.errors.OpError, match=r"element 1 feature 'a' is float64 of rank 0; the first element had int32"
    ):
        list(mixed.as_numpy_iterator())
