"""TFDS split slicing (`train[:90%]`, `train[10%:]`, `train[:1000]`, `+`), offline: the test
prepares a TFDS folder itself (dataset_info.json with shardLengths, sharded TFRecords)."""

import json
import pathlib

import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.datatasks import split_slicing
from cairn.datatasks.deterministic import cache_task_in_process, task_dir
from cairn.datatasks.deterministic.fingerprint import source_description

# train: 3 shards of 4, 3 and 5 examples (ids 0..11 in file order); validation: 1 shard of 3 (100..102).
SHARDS = {"train": [4, 3, 5], "validation": [3]}


def _example(i: int) -> bytes:
    feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tfds")
    folder = root / "toy" / "1.0.0"
    folder.mkdir(parents=True)
    splits = []
    for split, lengths in SHARDS.items():
        start = 0 if split == "train" else 100
        for s, n in enumerate(lengths):
            name = f"toy-{split}.tfrecord-{s:05d}-of-{len(lengths):05d}"
            with tf.io.TFRecordWriter(str(folder / name)) as w:
                for i in range(start, start + n):
                    w.write(_example(i))
            start += n
        splits.append({"name": split, "shardLengths": [str(n) for n in lengths]})
    (folder / "dataset_info.json").write_text(json.dumps({"name": "toy", "splits": splits}))
    return str(root)


def ids(source, split, **kw):
    return [int(x["id"]) for x in source.get_dataset(split, shuffle=False, **kw).as_numpy_iterator()]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("train", list(range(12))),
        ("train[:50%]", list(range(6))),
        ("train[25%:]", list(range(3, 12))),
        ("train[:1000]", list(range(12))),
        ("train[2:9]", list(range(2, 9))),
        ("train[-2:]", [10, 11]),
        ("train[-25%:]", list(range(9, 12))),
        ("train[:10%]", [0]),  # round(1.2) = 1
        ("train[:1shard]", [0, 1, 2, 3]),
        ("train[1shard:2shard]", [4, 5, 6]),
        ("train[:2]+validation", [0, 1, 100, 101, 102]),
        ("train[:1]+train[-1:]", [0, 11]),
    ],
)
def test_slices_select_the_examples_tfds_selects(data_dir, spec, expected):
    source = dt.TfdsDataSource("toy", data_dir, splits=[spec])
    assert source.splits == (spec,)
    assert source.num_input_examples(spec) == len(expected)
    assert ids(source, spec) == expected


def test_percent_rounds_to_the_closest_example_as_tfds():
    # TFDS's default rounding: int(round(boundary * n / 100)), Python's round (half to even).
    lengths = {"train": [5]}
    take = lambda spec: sum(w.take for w in split_slicing.resolve(spec, lengths))
    assert [take(f"train[:{p}%]") for p in (30, 50, 70, 90)] == [2, 2, 4, 4]
    assert take("train[:30%]") == 2  # 1.5 -> 2
    assert take("train[:50%]") == 2  # 2.5 -> 2
    assert take("train[:70%]") == 4  # 3.5 -> 4
    assert take("train[10%:]") == 5  # 0.5 -> 0
    with pytest.raises(dt.DataTasksError, match="selects no example"):
        take("train[:10%]")  # 0.5 -> 0: nothing


def test_a_mapping_names_the_task_splits(data_dir):
    source = dt.TfdsDataSource("toy", data_dir, splits={"train": "train[:75%]", "validation": "train[75%:]"})
    assert source.splits == ("train", "validation")
    assert ids(source, "train") == list(range(9)) and ids(source, "validation") == [9, 10, 11]
    assert (source.num_input_examples("train"), source.num_input_examples("validation")) == (9, 3)
    # The windows: train[:75%] is files 0 and 1 whole and the first 2 examples of file 2.
    files = source.source_files("train")
    assert [(f.name, f.skip, f.take) for f in files] == [
        ("toy-train.tfrecord-00000-of-00003", 0, None),
        ("toy-train.tfrecord-00001-of-00003", 0, None),
        ("toy-train.tfrecord-00002-of-00003", 0, 2),
    ]


def test_sharded_reads_of_a_slice_cover_it_once(data_dir):
    source = dt.TfdsDataSource("toy", data_dir, splits=["train[1:11]"])
    parts = [ids(source, "train[1:11]", shard_info=dt.ShardInfo(i, 3)) for i in range(3)]
    assert parts == [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10]]  # one file per shard, each file's window
    two = [ids(source, "train[1:11]", shard_info=dt.ShardInfo(i, 2)) for i in range(2)]
    assert sorted(two[0] + two[1]) == list(range(1, 11))
    shuffled = [int(x["id"]) for x in source.get_dataset("train[1:11]", shuffle=True, seed=3).as_numpy_iterator()]
    assert sorted(shuffled) == list(range(1, 11))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("train[:abc]", r"train\[:abc\].*cannot parse the slice boundary 'abc'"),
        ("train[1:2:3]", r"cannot parse 'train\[1:2:3\]'"),
        ("train[:150%]", r"150% is outside"),
        ("train[:5%:]", "cannot parse"),
        ("train[1:50%]", "same unit"),
        ("train[8:2]", r"split 'train\[8:2\]' selects no example"),
        ("train[12:]", "selects no example"),
        ("test[:10]", r"no split 'test' \(known: \['train', 'validation'\]\)"),
        ("train[:9shard]", "shard boundary 9 outside the split's 3 shards"),
        ("", "non-empty string"),
    ],
)
def test_bad_specs_name_the_problem(data_dir, spec, message):
    with pytest.raises(dt.DataTasksError, match=message):
        dt.TfdsDataSource("toy", data_dir, splits=[spec])


def test_shard_files_disagreeing_with_dataset_info_are_named(tmp_path, data_dir):
    src = pathlib.Path(data_dir, "toy", "1.0.0")
    folder = tmp_path / "toy" / "1.0.0"
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if not f.name.endswith("00002-of-00003"):
            (folder / f.name).write_bytes(f.read_bytes())
    with pytest.raises(dt.DataTasksError, match="dataset_info.json lists 3 shards, 2 files match"):
        dt.TfdsDataSource("toy", str(tmp_path), splits=["train[:50%]"])


def _task(data_dir: str, spec: str) -> dt.Task:
    return dt.Task(
        f"toy_slice_{abs(len(spec))}",
        dt.TfdsDataSource("toy", data_dir, splits={"train": spec}),
        preprocessors=[],
        output_features={},
    )


def test_the_cache_job_caches_the_slice_and_fingerprints_it(tmp_path, data_dir):
    task = _task(data_dir, "train[2:10]")
    path = task_dir(str(tmp_path), task.name, "train")
    assert cache_task_in_process(task, "train", path)
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    assert info["num_records"] == 8
    assert [s["num_records"] for s in info["shards"]] == [2, 3, 3]  # a window of each file
    # Another slice of the same files is another source: caches never mix them up.
    windows = [f.get("window") for f in source_description(task, "train")["files"]]
    assert windows == [[2, 2], None, [0, 3]]
    other = source_description(_task(data_dir, "train[2:11]"), "train")
    assert other != source_description(task, "train")
