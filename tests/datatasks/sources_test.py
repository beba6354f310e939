"""Data sources: splits, shards, parsing, sharding and the empty/unparsable line policy."""

import json
import os

import pytest
import tensorflow as tf
from data_util import write_lines

import cairn.datatasks as dt


def read(ds):
    return [x.decode() if isinstance(x, bytes) else x for x in ds.as_numpy_iterator()]


@pytest.fixture
def text_files(tmp_path):
    for i in range(4):
        write_lines(tmp_path / f"train-{i}.txt", [f"f{i} line {j}" for j in range(5)])
    write_lines(tmp_path / "dev.txt", ["header", "a", "", "   ", "b"])
    return tmp_path


def test_text_lines_split_glob_and_shards(text_files):
    src = dt.TextLineDataSource(
        {"train": str(text_files / "train-*.txt"), "validation": str(text_files / "dev.txt")},
        num_input_examples={"train": 20},
    )
    assert src.splits == ("train", "validation")
    assert [os.path.basename(p) for p in src.list_shards("train")] == [f"train-{i}.txt" for i in range(4)]
    assert src.num_input_examples("train") == 20
    assert src.num_input_examples("validation") is None
    assert read(src.get_dataset("train", shuffle=False))[:6] == [
        "f0 line 0",
        "f0 line 1",
        "f0 line 2",
        "f0 line 3",
        "f0 line 4",
        "f1 line 0",
    ]


def test_header_skip_and_empty_lines_are_counted(text_files):
    src = dt.TextLineDataSource({"validation": str(text_files / "dev.txt")}, skip_header_lines=1)
    stats = dt.DataStats()
    assert read(src.get_dataset("validation", shuffle=False, stats=stats)) == ["a", "b"]
    assert stats.as_dict() == {"empty_line": 2}


def test_unknown_split_and_missing_files(text_files):
    src = dt.TextLineDataSource({"train": str(text_files / "train-*.txt"), "test": str(text_files / "nothing-*.txt")})
    with pytest.raises(dt.UnknownNameError, match="'trian'.*'train'"):
        src.get_dataset("trian")
    with pytest.raises(dt.DataTasksError, match="split 'test': no file matches"):
        src.get_dataset("test")


@pytest.mark.parametrize("num_shards", [2, 3, 8])  # file-level (2, 3 <= 4 files), example-level (8)
def test_shards_are_disjoint_and_cover_the_split(text_files, num_shards):
    src = dt.TextLineDataSource({"train": str(text_files / "train-*.txt")})
    everything = read(src.get_dataset("train", shuffle=False))
    parts = [
        read(src.get_dataset("train", shuffle=True, seed=7, shard_info=dt.ShardInfo(i, num_shards)))
        for i in range(num_shards)
    ]
    flat = [x for p in parts for x in p]
    assert len(flat) == len(set(flat)) == len(everything)
    assert sorted(flat) == sorted(everything)


def test_shuffled_file_order_depends_on_seed_only(text_files):
    src = dt.TextLineDataSource({"train": str(text_files / "train-*.txt")})
    a = read(src.get_dataset("train", shuffle=True, seed=1))
    assert a == read(src.get_dataset("train", shuffle=True, seed=1))
    assert a != read(src.get_dataset("train", shuffle=True, seed=2))


def test_shard_info_is_checked():
    with pytest.raises(dt.DataTasksError, match="index"):
        dt.ShardInfo(2, 2)
    with pytest.raises(dt.DataTasksError, match="num_shards"):
        dt.ShardInfo(0, 0)


def test_tfexample_source(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(3):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"t{i}".encode()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    }
                )
            )
            w.write(ex.SerializeToString(deterministic=True))
    src = dt.TFExampleDataSource(
        {"train": path}, {"text": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    )
    out = list(src.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [(x["text"], x["label"]) for x in out] == [(b"t0", 0), (b"t1", 1), (b"t2", 2)]


def test_json_lines_source_infers_types_and_skips_bad_lines(tmp_path):
    rows = [
        json.dumps({"q": "why?", "ids": [1, 2], "n": 3}),
        "{not json",
        json.dumps({"q": "how?", "ids": [4], "n": 5}),
        json.dumps({"q": "missing fields"}),
    ]
    path = write_lines(tmp_path / "d.jsonl", rows)
    stats = dt.DataStats()
    out = list(
        dt.JsonLinesDataSource({"train": path}).get_dataset("train", shuffle=False, stats=stats).as_numpy_iterator()
    )
    assert [x["q"] for x in out] == [b"why?", b"how?"]
    assert [x["ids"].tolist() for x in out] == [[1, 2], [4]]
    assert [int(x["n"]) for x in out] == [3, 5]
    assert stats.as_dict() == {"unparsable": 2}


def test_function_source_with_seed_and_example_sharding():
    seen = {}

    def fn(split, shuffle_files, seed=None):
        seen.update(split=split, shuffle=shuffle_files, seed=seed)
        return tf.data.Dataset.range(10)

    src = dt.FunctionDataSource(fn, ["train"])
    got = list(src.get_dataset("train", shuffle=True, seed=4, shard_info=dt.ShardInfo(1, 3)).as_numpy_iterator())
    assert got == [1, 4, 7]
    assert seen == {"split": "train", "shuffle": True, "seed": 4}


def test_tfds_source_reads_a_prepared_folder_and_refuses_otherwise(tmp_path):
    folder = tmp_path / "toy" / "1.0.0"
    folder.mkdir(parents=True)
    (folder / "dataset_info.json").write_text(
        json.dumps({"name": "toy", "splits": [{"name": "train", "shardLengths": ["2"]}]})
    )
    with tf.io.TFRecordWriter(str(folder / "toy-train.tfrecord-00000-of-00001")) as w:
        for text in (b"hello", b"world"):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text])),
                        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2, 3])),
                    }
                )
            )
            w.write(ex.SerializeToString(deterministic=True))
    src = dt.TfdsDataSource("toy", str(tmp_path))
    assert src.splits == ("train",) and src.num_input_examples("train") == 2
    out = list(src.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [x["text"] for x in out] == [b"hello", b"world"]
    assert out[0]["ids"].tolist() == [1, 2, 3]
    at_url = dt.TfdsDataSource("toy", "file://" + str(tmp_path), ["train[1:]"])  # listed and read through storage
    assert [x["text"] for x in at_url.get_dataset("train[1:]", shuffle=False).as_numpy_iterator()] == [b"world"]
    with pytest.raises(dt.DataTasksError, match="not prepared.*does not download"):
        dt.TfdsDataSource("c4/en:3.0.1", str(tmp_path))


def _example(i: int) -> bytes:
    feature = {"v": tf.train.Feature(int64_list=tf.train.Int64List(value=[i] * (i % 3)))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def test_files_at_a_url_are_read_through_storage_as_tf_data_reads_them(tmp_path):
    """`file://` patterns take the URL path (`cairn.storage`, as gs:// does, without an emulator):
    the same examples in the same order as tf.data's readers on the local paths, for every
    shard and shuffle; TFRecord CRCs are checked; no match is the same one-line error."""
    from cairn.datatasks import url_sources

    for i, data in enumerate([b"h\r\na\n\n c \rd\r\r\ne", b"x\ny\n", b"", b"\n", b"  \nz"]):
        (tmp_path / f"t{i}.txt").write_bytes(data)
    with tf.io.TFRecordWriter(str(tmp_path / "r0.tfrecord")) as w:
        w.write(b"")  # an empty record: an empty Example
        for i in range(6):
            w.write(_example(i))
    with tf.io.TFRecordWriter(str(tmp_path / "r1.tfrecord")) as w:
        w.write(_example(9))
    (tmp_path / "j.jsonl").write_text('{"q": "a", "n": 1}\n\n{bad\n{"q": "b", "n": 2}\r\n')
    desc = {"v": tf.io.VarLenFeature(tf.int64)}
    make = [
        lambda p: dt.TextLineDataSource({"train": p + "/t*.txt"}, skip_header_lines=1),
        lambda p: dt.TextLineDataSource({"train": [p + "/t[0-2].txt", p + "/t4.txt"]}, skip_empty_lines=False),
        lambda p: dt.TFExampleDataSource({"train": p + "/r*.tfrecord"}, desc),
        lambda p: dt.JsonLinesDataSource({"train": p + "/*.jsonl"}),
    ]
    local, url = str(tmp_path), "file://" + str(tmp_path)
    for new in make:
        a, b = new(local), new(url)
        assert [f.name for f in a.source_files("train")] == [f.name for f in b.source_files("train")]
        assert all(p.startswith("file:///") for p in b.list_shards("train"))
        seen = 0
        for shard, shuffle in ((None, False), (None, True), (dt.ShardInfo(1, 2), True), (dt.ShardInfo(2, 5), False)):
            got = [
                [tf.nest.map_structure(lambda t: t.values if isinstance(t, tf.SparseTensor) else t, x) for x in s]
                for s in (src.get_dataset("train", shuffle=shuffle, seed=5, shard_info=shard) for src in (a, b))
            ]
            assert str(got[0]) == str(got[1])
            seen += len(got[0])
        assert seen > 4
    lines = list(dt.TextLineDataSource({"train": url + "/t0.txt"}, skip_empty_lines=False).get_dataset("train"))
    assert [x.numpy() for x in lines] == [b"h", b"a", b"", b" c d", b"e"]  # \r dropped, as TextLineDataset
    # A flipped payload byte, and a truncated file, are caught by the CRC / framing checks.
    good = (tmp_path / "r0.tfrecord").read_bytes()
    (tmp_path / "bad.tfrecord").write_bytes(good[:-5] + bytes([good[-5] ^ 1]) + good[-4:])  # last payload byte
    with pytest.raises(url_sources.CorruptSourceError, match=r"bad.tfrecord: corrupted record at byte \d+ \(CRC"):
        list(url_sources.batches(url + "/bad.tfrecord", "tfrecord"))
    (tmp_path / "bad.tfrecord").write_bytes(good[:-3])
    with pytest.raises(url_sources.CorruptSourceError, match="truncated record at byte"):
        list(url_sources.batches(url + "/bad.tfrecord", "tfrecord"))
    errors = []
    for root in (local, url):
        with pytest.raises(dt.DataTasksError) as e:
            dt.TextLineDataSource({"train": root + "/none-*.txt"}).source_files("train")
        errors.append(str(e.value).replace(root, "ROOT"))
    assert errors[0] == errors[1] == "split 'train': no file matches 'ROOT/none-*.txt'"
