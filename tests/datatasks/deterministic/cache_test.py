"""The cache layout, its idempotence, fingerprints and the reader's refusals (in-process)."""

import hashlib
import json
import os
import pathlib
import shutil

import det_tasks
import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic import (
    CachedTask,
    DeterministicReader,
    cache_task_in_process,
    records,
    task_dir,
    task_fingerprint,
)
from cairn.datatasks.deterministic.fingerprint import source_description
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.sources import pattern_root, relative_name


def test_layout_info_and_stats(det_env):
    _, cache_dir, registry = det_env
    path = task_dir(cache_dir, "det_a", "train")
    names = sorted(os.listdir(path))
    assert names[0] == "COMPLETED" and "info.json" in names and "stats.json" in names
    assert "shard-00000-of-00002.array_record" in names
    assert "shard-00001-of-00002.array_record" in names
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    assert info["num_records"] == 280 and info["task"] == "det_a"
    assert [s["num_records"] for s in info["shards"]] == [150, 130]
    assert info["length_features"] == ["inputs", "targets"]
    assert info["features"]["inputs_pretokenized"] == {"dtype": "string", "rank": 0}
    assert set(info["fingerprint"]) == {"preprocessors", "features", "vocabulary", "source", "total"}
    # Written once by the writer: per shard its size and SHA-256; the source files by name
    # relative to the pattern's root, never an absolute path.
    assert info["format_version"] == 2
    for s in info["shards"]:
        data = pathlib.Path(path, s["file"]).read_bytes()
        assert s["bytes"] == len(data) and s["sha256"] == hashlib.sha256(data).hexdigest()
    data = pathlib.Path(path, "lengths.npy").read_bytes()
    assert info["lengths"] == {"file": "lengths.npy", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    a0 = pathlib.Path(det_env[0], "a0.txt").read_bytes()
    assert info["source"]["files"][0] == {
        "pattern": 0,
        "name": "a0.txt",
        "size": len(a0),
        "sha256": hashlib.sha256(a0).hexdigest(),
    }
    assert [f["name"] for f in info["source"]["files"]] == ["a0.txt", "a1.txt"]
    assert det_env[0] not in pathlib.Path(path, "info.json").read_text()
    assert json.loads(pathlib.Path(path, "COMPLETED").read_text()) == {"format_version": 2}
    lengths = np.load(os.path.join(path, "lengths.npy"))
    assert lengths.shape == (280, 2) and lengths.dtype == np.int32
    stats = json.loads(pathlib.Path(path, "stats.json").read_text())
    assert stats["tokens"]["inputs"] == int(lengths[:, 0].sum())
    cache = CachedTask(path, registry.get_task("det_a"))
    assert isinstance(cache.lengths, np.memmap)  # local: mapped, not read into memory
    np.testing.assert_array_equal(cache.lengths, lengths)
    ex = records.parse(cache.read([151])[0], cache.specs)
    words = pathlib.Path(det_env[0], "a1.txt").read_text().splitlines()[1].split()
    assert ex["inputs_pretokenized"] == " ".join(words[: len(words) // 2]).encode()
    assert len(ex["inputs"]) == lengths[151, 0]


def test_records_are_the_same_bytes_on_every_run(det_env, tmp_path):
    data_dir, cache_dir, registry = det_env
    task = registry.get_task("det_b")
    other = task_dir(str(tmp_path), "det_b", "train")
    assert cache_task_in_process(task, "train", other)
    first = CachedTask(task_dir(cache_dir, "det_b", "train"), task)
    second = CachedTask(other, task)
    ids = list(range(first.num_records))
    assert first.read(ids) == second.read(ids)
    assert first.read([5, 3]) == [first.read([5])[0], first.read([3])[0]]


def test_rerun_is_a_no_op_unless_overwrite(det_env, tmp_path):
    _, _, registry = det_env
    task = registry.get_task("det_b")
    path = task_dir(str(tmp_path), "det_b", "train")
    assert cache_task_in_process(task, "train", path)
    stamp = os.stat(os.path.join(path, "COMPLETED")).st_mtime_ns
    assert not cache_task_in_process(task, "train", path)
    assert os.stat(os.path.join(path, "COMPLETED")).st_mtime_ns == stamp
    assert cache_task_in_process(task, "train", path, overwrite=True)


def test_incomplete_cache_is_refused_with_how_to_clear_it(det_env, tmp_path):
    _, _, registry = det_env
    task = registry.get_task("det_b")
    path = task_dir(str(tmp_path), "det_b", "train")
    cache_task_in_process(task, "train", path)
    os.remove(os.path.join(path, "COMPLETED"))
    with pytest.raises(DataTasksError, match=r"incomplete.*rm -r .*--overwrite"):
        cache_task_in_process(task, "train", path)
    with pytest.raises(DataTasksError, match=r"task 'det_b' lacks COMPLETED"):
        CachedTask(path, task)
    with pytest.raises(DataTasksError, match="lacks COMPLETED"):
        DeterministicReader(task, str(tmp_path), 0, 2, det_tasks.LENGTHS, dt.EncDecFeatureConverter())


def _fingerprints(data_dir, **kwargs):
    registry = dt.Registry()
    task = det_tasks.make(data_dir, registry, **kwargs)[1]
    return task, task_fingerprint(task, "train")


def test_fingerprint_changes_with_preprocessor_vocabulary_and_source(det_env, tmp_path):
    data_dir, cache_dir, _ = det_env
    base_task, base = _fingerprints(data_dir)
    assert _fingerprints(data_dir)[1] == base
    # A post-cache preprocessor is not part of the cache: same fingerprint.
    assert _fingerprints(data_dir, noisy=False)[1] == base
    assert _fingerprints(data_dir, extra_ids=10)[1]["vocabulary"] != base["vocabulary"]
    # A changed cacheable preprocessor (its arguments).
    registry = dt.Registry()
    changed = dt.Task(
        "det_b",
        base_task.source,
        base_task.output_features,
        [det_tasks.halves, dt.preprocessors.rekey, *base_task.preprocessors[1:]],
    )
    assert task_fingerprint(changed, "train")["preprocessors"] != base["preprocessors"]
    # A changed source file.
    copy = tmp_path / "data"
    copy.mkdir()
    for p in pathlib.Path(data_dir).iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    task2, same = _fingerprints(str(copy))
    assert same["preprocessors"] == base["preprocessors"]
    assert same["source"] == base["source"]  # a copy elsewhere: the same relative names
    with open(copy / "b0.txt", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    _, moved = _fingerprints(str(copy))
    assert moved["source"] != same["source"] and moved["total"] != same["total"]
    del registry


def test_reader_refuses_a_cache_of_another_definition(det_env):
    data_dir, cache_dir, _ = det_env
    registry = dt.Registry()
    task = det_tasks.make(data_dir, registry, extra_ids=10)[1]
    with pytest.raises(
        DataTasksError,
        match=r"does not match task 'det_b'.*vocabulary changed.*cache [0-9a-f]+ "
        r"vs task [0-9a-f]+",
    ):
        DeterministicReader(task, cache_dir, 0, 2, det_tasks.LENGTHS, dt.EncDecFeatureConverter())
    with pytest.raises(DataTasksError, match="holds task 'det_a'"):
        CachedTask(task_dir(cache_dir, "det_a", "train"), task)


def test_pattern_root_is_the_directory_part_before_the_first_glob_character():
    assert pattern_root("/data/c4/train-*.txt") == "/data/c4"
    assert pattern_root("/data/*/part-?.txt") == "/data"
    assert pattern_root("/data/c4/train-0000[0-4].txt") == "/data/c4"
    assert pattern_root("/data/dev.txt") == "/data"
    assert pattern_root("gs://bucket/x/*.json") == "gs://bucket/x"
    assert pattern_root("rel/dir/*.txt") == "rel/dir"
    assert pattern_root("*.txt") == ""
    assert pattern_root("/top-*.txt") == "/"
    assert relative_name("/top-1.txt", "/") == "top-1.txt"
    assert relative_name("/data/c4/x/a.txt", "/data/c4") == "x/a.txt"


def _source_fp(data_dir, pattern="b*.txt"):
    src = dt.TextLineDataSource({"train": os.path.join(str(data_dir), pattern)})
    task = dt.Task("t", src, {"targets": dt.Feature(det_tasks.ByteVocabulary())}, [])
    return task_fingerprint(task, "train")["source"], source_description(task, "train")


def test_source_fingerprint_is_relative_to_the_pattern_root(det_env, tmp_path):
    data_dir = det_env[0]
    base, desc = _source_fp(data_dir)
    assert [(f["pattern"], f["name"]) for f in desc["files"]] == [(0, "b0.txt")]
    # Another directory (a second clone, another machine): the same fingerprint.
    copy = tmp_path / "elsewhere" / "data"
    shutil.copytree(data_dir, copy)
    assert _source_fp(copy)[0] == base
    # One byte changed (same size): another fingerprint.
    raw = bytearray((copy / "b0.txt").read_bytes())
    raw[10] ^= 1
    (copy / "b0.txt").write_bytes(bytes(raw))
    assert _source_fp(copy)[0] != base
    raw[10] ^= 1
    (copy / "b0.txt").write_bytes(bytes(raw))
    assert _source_fp(copy)[0] == base
    # Renamed within the root: another fingerprint (the names are part of it).
    (copy / "b0.txt").rename(copy / "b9.txt")
    assert _source_fp(copy)[0] != base
    # A glob in the directory part: names keep the sub-directory below the root.
    nested = tmp_path / "nested"
    (nested / "x").mkdir(parents=True)
    shutil.copy(os.path.join(data_dir, "b0.txt"), nested / "x" / "b0.txt")
    _, desc = _source_fp(nested, "*/b*.txt")
    assert [f["name"] for f in desc["files"]] == ["x/b0.txt"]


def test_a_cache_of_copied_sources_is_read_by_a_task_over_the_copy(det_env, tmp_path):
    """The second clone: the sources live elsewhere, the cache still matches."""
    data_dir, cache_dir, _ = det_env
    copy = tmp_path / "clone" / "data"
    shutil.copytree(data_dir, copy)
    registry = dt.Registry()
    det_tasks.make(str(copy), registry)
    reader = DeterministicReader(
        "det_mix", cache_dir, 0, 4, det_tasks.LENGTHS, dt.EncDecFeatureConverter(pack=True), registry=registry
    )
    assert next(reader)["encoder_input_tokens"].shape == (4, 48)
    reader.close()


def test_lengths_at_a_url_are_copied_once_or_read_into_memory_when_home_is_read_only(tmp_path, monkeypatch, capfd):
    import io

    from cairn import storage
    from cairn.datatasks.deterministic import store

    buf = io.BytesIO()
    np.save(buf, np.arange(7, dtype=np.int32))
    url = f"memory://lengths-test/{tmp_path.name}/lengths.npy"
    storage.write_bytes(url, buf.getvalue())
    monkeypatch.setenv("CAIRN_CACHE_HOME", str(tmp_path / "home"))
    mapped = store.load_lengths(url, "sha-a")
    assert isinstance(mapped, np.memmap) and mapped.tolist() == list(range(7))
    assert (tmp_path / "home" / "lengths" / "sha-a.npy").exists()
    (tmp_path / "file").write_text("")  # a home that cannot hold folders
    monkeypatch.setenv("CAIRN_CACHE_HOME", str(tmp_path / "file"))
    in_memory = store.load_lengths(url, "sha-b")
    assert not isinstance(in_memory, np.memmap) and in_memory.tolist() == list(range(7))
    assert "reading it into memory" in capfd.readouterr().err
