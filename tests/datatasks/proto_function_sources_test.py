"""`ProtoDataSource` (TFRecords of serialized protos + a decode function) and function sources
that read one shard (`shard_info`), each through the streaming path and the cache job."""

import json
import pathlib

import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import cairn.datatasks as dt
from cairn.datatasks.deterministic import cache_task_in_process, task_dir
from cairn.datatasks.deterministic.fingerprint import source_description

F = descriptor_pb2.FieldDescriptorProto


def _review_proto() -> descriptor_pb2.FileDescriptorProto:
    """`cairntest.Review {string text = 1; int64 stars = 2; repeated int64 tags = 3;}`, built
    in code (no protoc here)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="cairntest/review.proto", package="cairntest", syntax="proto3")
    m = fdp.message_type.add(name="Review")
    m.field.add(name="text", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    m.field.add(name="stars", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="tags", number=3, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    return fdp


REVIEWS = [("good play", 5, [1, 2]), ("too long", 2, []), ("fine", 4, [3])]


@pytest.fixture(scope="module")
def proto_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("protos")
    fdp = _review_proto()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    review = message_factory.GetMessageClass(pool.FindMessageTypeByName("cairntest.Review"))
    descriptors = root / "review.desc"
    descriptors.write_bytes(descriptor_pb2.FileDescriptorSet(file=[fdp]).SerializeToString())
    for shard, rows in enumerate([REVIEWS[:2], REVIEWS[2:]]):
        with tf.io.TFRecordWriter(str(root / f"reviews-{shard}.tfrecord")) as w:
            for text, stars, tags in rows:
                w.write(review(text=text, stars=stars, tags=tags).SerializeToString(deterministic=True))
    return root, str(descriptors)


def _decoder(descriptors: str):
    def decode_review(serialized):
        sizes, (text, stars, tags) = tf.io.decode_proto(
            serialized,
            "cairntest.Review",
            ["text", "stars", "tags"],
            [tf.string, tf.int64, tf.int64],
            descriptor_source=descriptors,
        )
        # A scalar record gives each field at least one value (defaults when absent): trim repeated ones.
        return {"text": text[0], "stars": stars[0], "tags": tags[: sizes[2]]}

    return decode_review


def test_proto_source_decodes_every_record(proto_files):
    root, descriptors = proto_files
    source = dt.ProtoDataSource({"train": str(root / "reviews-*.tfrecord")}, _decoder(descriptors))
    rows = list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [(r["text"].decode(), int(r["stars"]), r["tags"].tolist()) for r in rows] == [
        (t, s, g) for t, s, g in REVIEWS
    ]
    second = list(source.get_dataset("train", shuffle=False, shard_info=dt.ShardInfo(1, 2)).as_numpy_iterator())
    assert [r["text"] for r in second] == [b"fine"]  # file-level shards


def test_proto_source_caches_and_its_decoder_is_fingerprinted(tmp_path, proto_files):
    root, descriptors = proto_files
    source = dt.ProtoDataSource({"train": str(root / "reviews-*.tfrecord")}, _decoder(descriptors))
    task = dt.Task("reviews", source, output_features={})
    path = task_dir(str(tmp_path), "reviews", "train")
    assert cache_task_in_process(task, "train", path)
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    assert info["num_records"] == 3 and set(info["features"]) == {"text", "stars", "tags"}

    def decode_stars_only(serialized):
        _, (stars,) = tf.io.decode_proto(
            serialized, "cairntest.Review", ["stars"], [tf.int64], descriptor_source=descriptors
        )
        return {"stars": stars[0]}

    other = dt.Task("reviews", dt.ProtoDataSource({"train": str(root / "reviews-*.tfrecord")}, decode_stars_only), {})
    a, b = source_description(task, "train"), source_description(other, "train")
    assert a["files"] == b["files"] and a["code"] != b["code"] and "decode_review" in a["code"]


def _sharded_fn(split, shuffle_files, seed=None, shard_info=None):
    """Ten "files" of ten numbers; a shard reads only its files (every num_shards-th)."""
    files = list(range(10))  # int64 ids
    if shard_info is not None:
        files = files[shard_info.index :: shard_info.num_shards]
    return tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.int64)).flat_map(
        lambda f: tf.data.Dataset.range(f * 10, f * 10 + 10)
    )


def test_function_source_with_shard_info_reads_its_shard_only():
    source = dt.FunctionDataSource(_sharded_fn, ["train"], num_shards=4)
    assert source.list_shards("train") == [f"train-{i:05d}-of-00004" for i in range(4)]
    shards = [list(source.get_dataset("train", shard_info=dt.ShardInfo(i, 4)).as_numpy_iterator()) for i in range(4)]
    assert shards[1] == list(range(10, 20)) + list(range(50, 60)) + list(range(90, 100))
    assert sorted(sum(shards, [])) == list(range(100))
    whole = list(dt.FunctionDataSource(_sharded_fn, ["train"]).get_dataset("train").as_numpy_iterator())
    assert whole == list(range(100))


def test_the_cache_job_writes_one_shard_per_function_shard(tmp_path):
    def as_features(split, shuffle_files, shard_info=None):
        return _sharded_fn(split, shuffle_files, shard_info=shard_info).map(lambda n: {"n": n})

    source = dt.FunctionDataSource(as_features, ["train"], num_shards=3)
    task = dt.Task("fn_shards", source, output_features={})
    path = task_dir(str(tmp_path), "fn_shards", "train")
    assert cache_task_in_process(task, "train", path)
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    assert [s["num_records"] for s in info["shards"]] == [40, 30, 30]


def test_num_shards_needs_a_function_taking_shard_info():
    def fn(split, shuffle_files):
        return tf.data.Dataset.range(3)

    with pytest.raises(dt.DataTasksError, match="num_shards=2 needs a dataset_fn taking shard_info.*'fn'"):
        dt.FunctionDataSource(fn, ["train"], num_shards=2)
    with pytest.raises(dt.DataTasksError, match="num_shards must be an int >= 1"):
        dt.FunctionDataSource(_sharded_fn, ["train"], num_shards=0)
