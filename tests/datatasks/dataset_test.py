"""get_dataset: seeds, shards, epochs, checkpointed iterators, validation, bad-data counts."""

import numpy as np
import pytest
import tensorflow as tf
from data_util import ids_dataset, ids_vocab, write_lines

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp

LENGTHS = {"inputs": 32, "targets": 16}


def halves(ds):
    def fn(line):
        words = tf.strings.split(line)
        half = tf.size(words) // 2
        return {
            "inputs": tf.strings.reduce_join(words[:half], separator=" "),
            "targets": tf.strings.reduce_join(words[half:], separator=" "),
        }

    return ds.map(fn)


@pytest.fixture(scope="module")
def task(lines, sp_vocab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    chunk = list(dict.fromkeys(lines[:200]))  # unique lines, so shards can be compared
    for i in range(2):
        write_lines(folder / f"part-{i}.txt", chunk[i::2])
    feats = {"inputs": dt.Feature(sp_vocab), "targets": dt.Feature(sp_vocab)}
    return dt.Task(
        "shakespeare_halves",
        dt.TextLineDataSource({"train": str(folder / "part-*")}),
        feats,
        [halves, pp.tokenize, pp.append_eos_after_trim],
    )


@pytest.fixture(scope="module")
def denoise_task(lines, sp_vocab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    write_lines(folder / "all.txt", lines[:600])
    feats = {"inputs": dt.Feature(sp_vocab), "targets": dt.Feature(sp_vocab)}
    return dt.Task(
        "shakespeare_span",
        dt.TextLineDataSource({"train": str(folder / "all.txt")}),
        feats,
        [lambda ds: ds.map(lambda s: {"targets": s}), pp.tokenize, pp.span_corruption, pp.append_eos_after_trim],
    )


def batches(ds, n=None):
    it = ds.as_numpy_iterator()
    out = []
    for b in it:
        out.append({k: v.copy() for k, v in b.items()})
        if n is not None and len(out) == n:
            break
    return out


def same(a, b):
    return len(a) == len(b) and all(
        set(x) == set(y) and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


def key(x):
    return x["inputs_pretokenized"] + b"|" + x["targets_pretokenized"]


@pytest.fixture(scope="module")
def whole(task):
    """The split's examples, shuffled (seed 0), one epoch: what the shard and epoch tests
    compare with (one pipeline for them all)."""
    return [key(x) for x in task.get_dataset(LENGTHS, shuffle=True, seed=0).as_numpy_iterator()]


@pytest.mark.parametrize("num_shards", [2, 3])  # whole files (2 files), examples
def test_shards_are_disjoint_and_their_union_is_the_split(task, whole, num_shards):
    def rows(shard):
        ds = task.get_dataset(LENGTHS, shuffle=True, seed=0, shard_info=shard)
        return [key(x) for x in ds.as_numpy_iterator()]

    parts = [rows(dt.ShardInfo(i, num_shards)) for i in range(num_shards)]
    flat = [r for p in parts for r in p]
    assert all(parts)
    assert len(flat) == len(whole)
    assert sorted(flat) == sorted(whole)
    for i in range(num_shards):
        for j in range(i + 1, num_shards):
            assert not set(parts[i]) & set(parts[j])


def test_num_epochs(task, whole):
    a = whole  # num_epochs=1, the default
    two = task.get_dataset(LENGTHS, shuffle=True, seed=0, num_epochs=2)
    b = [key(x) for x in two.as_numpy_iterator()]
    assert sorted(b) == sorted(a + a)
    assert b[len(a) :] != b[: len(a)]  # the buffer spans epochs; no repeated order
    forever = task.get_dataset(LENGTHS, shuffle=True, seed=0, num_epochs=None)
    # Past two epochs: a third begins.
    assert len(list(forever.take(2 * len(a) + 1).as_numpy_iterator())) == 2 * len(a) + 1


@pytest.mark.parametrize("which", ["task", "denoise_task"])
def test_restored_iterator_continues_exactly_and_the_seed_decides(which, request, tmp_path):
    """A restored iterator continues as the uninterrupted one; the same seed gives the same
    batches (a pipeline built anew), another seed others: for `task` through the shuffle, for
    `denoise_task` (unshuffled) through its random preprocessing alone. Three pipelines: the
    checkpointed one, the one restored (first read from its start), another seed's."""
    t = request.getfixturevalue(which)
    lengths = LENGTHS if which == "task" else {"inputs": 64, "targets": 16}

    def make(seed=11):
        return dt.get_dataset(
            t,
            lengths,
            dt.EncDecFeatureConverter(pack=True),
            shuffle=which == "task",
            seed=seed,
            batch_size=4,
            num_epochs=None,
        )

    def take(iterator, n):
        return [{k: v.numpy() for k, v in next(iterator).items()} for _ in range(n)]

    it = iter(make())
    ckpt = tf.train.Checkpoint(iterator=it)
    first = take(it, 3)
    path = ckpt.write(str(tmp_path / "ckpt"))
    expected = take(it, 5)

    # A pipeline built anew with the same seed gives the same batches; read two of them (not
    # three: a restore that did nothing would then give batches 2-6, not 3-7), then restore.
    fresh = iter(make())
    assert same(first[:2], take(fresh, 2))
    tf.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    assert same(expected, take(fresh, 5))
    assert not same(first + expected[:1], batches(make(seed=12), 4))


def test_overlong_examples_are_trimmed_or_skipped_and_counted():
    src = dt.FunctionDataSource(
        lambda split, shuffle_files: ids_dataset(
            [{"targets": [5, 6, 7, 8, 9]}, {"targets": [5, 6]}, {"targets": [4, 4, 4, 4]}]
        ),
        ["train"],
    )
    feats = {"targets": dt.Feature(ids_vocab())}
    stats = dt.DataStats()
    t = dt.Task("trim_me", src, feats)
    out = [x["targets"].tolist() for x in t.get_dataset({"targets": 3}, shuffle=False, stats=stats).as_numpy_iterator()]
    assert out == [[5, 6, 7], [5, 6], [4, 4, 4]]
    assert stats.as_dict() == {"overlong_trimmed/targets": 2}
    stats = dt.DataStats()
    t = dt.Task("skip_me", src, feats, bad_data_policy=dt.BadDataPolicy(overlong="skip"))
    out = [x["targets"].tolist() for x in t.get_dataset({"targets": 3}, shuffle=False, stats=stats).as_numpy_iterator()]
    assert out == [[5, 6]]
    assert stats.as_dict() == {"overlong_skipped/targets": 2}


def test_bad_data_counts_through_get_dataset(sp_vocab, tmp_path):
    path = tmp_path / "raw.txt"
    path.write_bytes(b"one two three four\n\n   \nbad \xff bytes here\nfive six\n")
    feats = {"inputs": dt.Feature(sp_vocab), "targets": dt.Feature(sp_vocab)}
    t = dt.Task(
        "raw", dt.TextLineDataSource({"train": str(path)}), feats, [halves, pp.tokenize, pp.append_eos_after_trim]
    )
    stats = dt.DataStats()
    ds = dt.get_dataset(
        t, {"inputs": 4, "targets": 4}, dt.EncDecFeatureConverter(pack=False), shuffle=False, stats=stats
    )
    assert len(list(ds.as_numpy_iterator())) == 3
    assert stats.count("empty_line") == 2
    assert stats.as_dict()["undecodable_replaced/inputs"] == 1


def test_validation_names_task_feature_and_example(sp_vocab):
    feats = {"targets": dt.Feature(ids_vocab(50))}
    src = dt.FunctionDataSource(
        lambda split, shuffle_files: ids_dataset([{"targets": [5]}, {"targets": [6]}, {"targets": [7, 70]}]), ["train"]
    )
    ds = dt.Task("ids_task", src, feats).get_dataset({"targets": 4}, shuffle=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        list(ds.as_numpy_iterator())
    msg = str(e.value)
    assert "task ids_task: feature targets of example] [2]" in msg

    text_src = dt.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.from_tensors({"targets": "hi"}), ["train"]
    )
    with pytest.raises(dt.DataTasksError, match="task 'untokenized'.*'targets' has dtype string"):
        dt.Task("untokenized", text_src, {"targets": dt.Feature(sp_vocab)}).get_dataset()
    with pytest.raises(dt.DataTasksError, match="task 'no_inputs'.*required feature 'inputs'"):
        dt.Task(
            "no_inputs", src, {"targets": dt.Feature(ids_vocab(50)), "inputs": dt.Feature(ids_vocab(50))}
        ).get_dataset()
    optional = dt.Task(
        "optional_inputs",
        src,
        {"targets": dt.Feature(ids_vocab(100)), "inputs": dt.Feature(ids_vocab(100), required=False)},
    )
    assert len(list(optional.get_dataset(shuffle=False).as_numpy_iterator())) == 3


def test_get_dataset_argument_errors(registry, task):
    registry.add_task(task)
    with pytest.raises(dt.UnknownNameError, match="'shakespeare_halfs'.*'shakespeare_halves'"):
        dt.get_dataset("shakespeare_halfs", LENGTHS, registry=registry)
    with pytest.raises(dt.DataTasksError, match="'targets'.*room for one token"):
        dt.get_dataset("shakespeare_halves", {"inputs": 8, "targets": 0}, registry=registry)
    ds = dt.get_dataset("shakespeare_halves", LENGTHS, registry=registry, batch_size=2)
    assert ds.element_spec["encoder_input_tokens"].shape == [2, 32]
