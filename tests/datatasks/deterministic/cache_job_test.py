"""End to end: the `cache_tasks` job on Apache Beam's defaults (DirectRunner, 2 worker processes
that import the tasks' module); a
task whose text and TFRecord sources are in a bucket (fake-gcs-server) cached on Beam into the
bucket, equal to the same task cached from local copies."""

import os
import sys

import det_tasks
import numpy as np
import pytest

import cairn.datatasks as dt
from cairn import storage
from cairn.datatasks import preprocessors as pp
from cairn.datatasks.deterministic import CachedTask, DeterministicReader, cache_task_in_process, task_dir
from cairn.datatasks.deterministic.cache_job import cache_tasks
from cairn.datatasks.lazy_tf import tf
from cairn.tokenizers import ByteVocabulary

HERE = os.path.dirname(os.path.abspath(__file__))


def test_cache_tasks_on_beam_matches_the_in_process_cache(det_env, tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    (tmp_path / "beam_tasks.py").write_text(
        f"import cairn.datatasks as dt\nimport det_tasks\ndet_tasks.make({str(data_dir)!r}, dt.DEFAULT_REGISTRY)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), HERE, *sys.path]))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "out")
    # The defaults: DirectRunner, 2 worker processes (each imports beam_tasks, which registers the tasks).
    assert cache_tasks("det_.*", out, module_import=["beam_tasks"]) == {"det_a": "cached", "det_b": "cached"}
    registry = dt.Registry()
    det_tasks.make(str(data_dir), registry)
    for name in ("det_a", "det_b"):
        beam = CachedTask(task_dir(str(tmp_path / "out"), name, "train"), registry.get_task(name))
        local = CachedTask(task_dir(det_env[1], name, "train"))
        ids = list(range(local.num_records))
        assert beam.num_records == local.num_records
        assert beam.read(ids) == local.read(ids)  # record i: the same bytes
        np.testing.assert_array_equal(beam.lengths, local.lengths)
    reader = DeterministicReader(
        "det_mix", str(tmp_path / "out"), 7, 4, det_tasks.LENGTHS, dt.EncDecFeatureConverter(), registry=registry
    )
    assert next(reader)["encoder_input_tokens"].shape == (4, 48)
    # A rerun on complete caches does nothing (no pipeline starts; options pass through).
    again = cache_tasks("det_.*", out, module_import=["beam_tasks"], pipeline_options=["--runner=DirectRunner"])
    assert again == {"det_a": "already cached", "det_b": "already cached"}
    # An incomplete cache is refused with how to clear it.
    os.remove(os.path.join(task_dir(out, "det_b", "train"), "COMPLETED"))
    with pytest.raises(dt.DataTasksError, match=r"incomplete.*(rm -r.*--overwrite|--overwrite.*rm -r)"):
        cache_tasks("det_.*", out, module_import=["beam_tasks"], pipeline_options=["--runner=DirectRunner"])


@pytest.fixture(scope="module")
def bucket():
    """`gs://sources` in a fake-gcs-server that this process (and Beam's workers) read."""
    from cairn.storage.testing import GcsEmulator

    emu = GcsEmulator().start()
    try:
        emu.activate()
        yield emu.create_bucket("sources")
    finally:
        emu.stop()


def _write_records(data_dir):
    """`r0.tfrecord`, `r1.tfrecord`: det_tasks' `b0.txt` lines as Examples (inputs, targets)."""
    lines = (data_dir / "b0.txt").read_text().splitlines()
    for i, part in enumerate((lines[:50], lines[50:])):
        with tf.io.TFRecordWriter(str(data_dir / f"r{i}.tfrecord")) as w:
            for line in part:
                words = line.split()
                pair = {"inputs": " ".join(words[: len(words) // 2]), "targets": " ".join(words[len(words) // 2 :])}
                feature = {
                    k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()])) for k, v in pair.items()
                }
                w.write(
                    tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)
                )


def _url_tasks(data_dir: str) -> dt.Mixture:
    """A text task (det_tasks' a*.txt) and a TFRecord task over `data_dir`, and their mixture."""
    registry = dt.Registry()
    feats = {"inputs": dt.Feature(ByteVocabulary()), "targets": dt.Feature(ByteVocabulary())}
    text = dt.TextLineDataSource({"train": data_dir + "/a*.txt"})
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in feats}
    records = dt.TFExampleDataSource({"train": data_dir + "/r*.tfrecord"}, spec)
    registry.add_task(dt.Task("url_text", text, feats, [det_tasks.halves, pp.tokenize, pp.append_eos_after_trim]))
    registry.add_task(dt.Task("url_records", records, feats, [pp.tokenize, pp.append_eos_after_trim]))
    return registry.add_mixture(dt.Mixture("url_mix", [("url_text", 2.0), ("url_records", 1.0)], registry=registry))


def test_sources_in_a_bucket_cache_on_beam_as_local_copies(bucket, tmp_path):
    """Text and TFRecord sources in the bucket, read through cairn.storage by the Beam job
    (DirectRunner, in memory) and cached into the bucket: the same fingerprint, shard SHA-256s,
    records and reader batches as the same tasks cached from local copies; a gs:// pattern that
    matches nothing (or a missing bucket) is the local one-line error."""
    data = tmp_path / "data"
    det_tasks.write_sources(str(data))
    _write_records(data)
    remote = bucket + "/data"
    for name in ("a0.txt", "a1.txt", "r0.tfrecord", "r1.tfrecord"):
        storage.copy_file(str(data / name), storage.join(remote, name))
    local_mix, url_mix = _url_tasks(str(data)), _url_tasks(remote)
    local_cache, url_cache = str(tmp_path / "cache"), bucket + "/cache"
    for task in local_mix.tasks.values():
        cache_task_in_process(task, "train", task_dir(local_cache, task.name, "train"))
    options = ["--runner=DirectRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
    done = cache_tasks(list(url_mix.tasks.values()), url_cache, pipeline_options=options)
    assert done == {"url_text": "cached", "url_records": "cached"}
    for name, task in url_mix.tasks.items():
        here, there = (
            CachedTask(task_dir(local_cache, name, "train")),
            CachedTask(task_dir(url_cache, name, "train"), task),
        )
        assert there.info["fingerprint"] == here.info["fingerprint"] and there.info["source"] == here.info["source"]
        assert [s["sha256"] for s in there.info["shards"]] == [s["sha256"] for s in here.info["shards"]]
        assert len(there.info["shards"]) == 2 and there.num_records == here.num_records > 50
        ids = list(range(here.num_records))
        assert there.read(ids) == here.read(ids)
    readers = [
        DeterministicReader(mix, cache, 3, 4, det_tasks.LENGTHS, dt.EncDecFeatureConverter(), prefetch=0)
        for mix, cache in ((local_mix, local_cache), (url_mix, url_cache))
    ]
    for _ in range(3):
        a, b = (next(r) for r in readers)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    errors = []
    for root in (str(data), bucket + "/data", "gs://no-such-bucket/data"):
        source = dt.TextLineDataSource({"train": root + "/none-*.txt"})
        task = dt.Task("url_none", source, url_mix.tasks["url_text"].output_features, [])
        with pytest.raises(dt.DataTasksError) as e:
            cache_tasks([task], str(tmp_path / "none"), pipeline_options=options)
        errors.append(str(e.value).replace(root, "ROOT"))
    assert errors == ["split 'train': no file matches 'ROOT/none-*.txt'"] * 3
