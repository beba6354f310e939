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
    cache_writer,
    record_stage,
    store,
    task_dir,
    task_fingerprint,
)
from cairn.datatasks.deterministic import reader as reader_lib
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
    assert info["format_version"] == 4
    assert info["group_size"] == 512 and info["record_order"] == "shuffled_within_shards"
    for s in info["shards"]:
        data = pathlib.Path(path, s["file"]).read_bytes()
        assert s["bytes"] == len(data) and s["sha256"] == hashlib.sha256(data).hexdigest()
    data = pathlib.Path(path, "lengths.npy").read_bytes()
    assert info["lengths"] == {"file": "lengths.npy", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    data = pathlib.Path(path, "chunks.npy").read_bytes()  # a chunk per shard: (offset, length, CRC-32)
    assert info["chunks"] == {"file": "chunks.npy", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    chunks = np.load(os.path.join(path, "chunks.npy"))
    assert chunks.shape == (2, 3) and chunks[:, 0].tolist() == [64, 64]  # after the file signature
    a0 = pathlib.Path(det_env[0], "a0.txt").read_bytes()
    assert info["source"]["files"][0] == {
        "pattern": 0,
        "name": "a0.txt",
        "size": len(a0),
        "sha256": hashlib.sha256(a0).hexdigest(),
    }
    assert [f["name"] for f in info["source"]["files"]] == ["a0.txt", "a1.txt"]
    assert det_env[0] not in pathlib.Path(path, "info.json").read_text()
    assert json.loads(pathlib.Path(path, "COMPLETED").read_text()) == {"format_version": 4}
    lengths = np.load(os.path.join(path, "lengths.npy"))
    assert lengths.shape == (280, 2) and lengths.dtype == np.int32
    stats = json.loads(pathlib.Path(path, "stats.json").read_text())
    assert stats["tokens"]["inputs"] == int(lengths[:, 0].sum())
    cache = CachedTask(path, registry.get_task("det_a"))
    assert isinstance(cache.lengths, np.memmap)  # local: mapped, not read into memory
    np.testing.assert_array_equal(cache.lengths, lengths)
    # Shard 1's records are shuffled: source line 1 of a1.txt is its record order.index(1).
    order = store.within_shard_order(info["shuffle_key"], 1, 130)
    assert sorted(order.tolist()) == list(range(130)) and order[:20].tolist() != list(range(20))
    at = 150 + int(np.nonzero(order == 1)[0][0])
    ex = record_stage.parse(cache.read([at])[0], cache.specs)
    words = pathlib.Path(det_env[0], "a1.txt").read_text().splitlines()[1].split()
    assert ex["inputs_pretokenized"] == " ".join(words[: len(words) // 2]).encode()
    assert len(ex["inputs"]) == lengths[at, 0]


def test_records_are_the_same_bytes_on_every_run(det_env, tmp_path):
    data_dir, cache_dir, registry = det_env
    task = registry.get_task("det_b")
    other = task_dir(str(tmp_path), "det_b", "train")
    assert cache_task_in_process(task, "train", other)
    first = CachedTask(task_dir(cache_dir, "det_b", "train"), task)
    second = CachedTask(other, task)
    ids = list(range(first.num_records))
    assert first.read(ids) == second.read(ids)
    # The within-shard shuffle is seeded: the same shard files, byte for byte.
    assert [s["sha256"] for s in first.info["shards"]] == [s["sha256"] for s in second.info["shards"]]
    assert first.info["shuffle_key"] == second.info["shuffle_key"] and first.info["shuffle_key"]
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
    mapped = store.load_npy(url, "sha-a")
    assert isinstance(mapped, np.memmap) and mapped.tolist() == list(range(7))
    assert (tmp_path / "home" / "lengths" / "sha-a.npy").exists()
    (tmp_path / "file").write_text("")  # a home that cannot hold folders
    monkeypatch.setenv("CAIRN_CACHE_HOME", str(tmp_path / "file"))
    in_memory = store.load_npy(url, "sha-b")
    assert not isinstance(in_memory, np.memmap) and in_memory.tolist() == list(range(7))
    assert "reading it into memory" in capfd.readouterr().err


# -- formats 3 and 4: chunked shards, shuffled within shards; the chunk and open-shard LRUs ---


@pytest.fixture(scope="module")
def chunked(det_env, tmp_path_factory):
    """`(task, {group size: cache path})`: det_a (shards of 150 and 130 records) cached with
    7 records per chunk (chunks that straddle nothing: 22 + 19) and with 1; `"f3"`: the 7-record
    cache as format 3 wrote it (no chunk index: read through ArrayRecord readers)."""
    _, _, registry = det_env
    task = registry.get_task("det_a")
    root = tmp_path_factory.mktemp("chunked")
    paths = {}
    for g in (7, 1):
        paths[g] = task_dir(str(root / f"g{g}"), "det_a", "train")
        cache_task_in_process(task, "train", paths[g], group_size=g)
    paths["f3"] = task_dir(str(root / "f3"), "det_a", "train")
    shutil.copytree(paths[7], paths["f3"])
    _as_format(paths["f3"], 3)
    return task, paths


def test_a_chunked_cache_reads_every_record_by_global_index_in_any_order(chunked, det_env):
    task, paths = chunked
    seven, one, three = CachedTask(paths[7], task), CachedTask(paths[1], task), CachedTask(paths["f3"], task)
    default = CachedTask(task_dir(det_env[1], "det_a", "train"), task)  # 512 per chunk
    assert (seven.group_size, one.group_size, default.group_size, three.group_size) == (7, 1, 512, 7)
    assert seven.offsets.tolist() == [0, 150, 280] and seven.num_chunks == 22 + 19
    assert seven.chunk_of([0, 6, 7, 149, 150, 156, 157, 279]).tolist() == [0, 0, 1, 21, 22, 22, 23, 40]
    # The same shuffle (it depends on the shard and the task, not the chunk size): the same
    # record at every global index, whatever the chunking.
    np.testing.assert_array_equal(seven.lengths, one.lengths)
    ids = np.random.default_rng(0).permutation(280).tolist() + [149, 150, 0, 279, 6, 7, 6]
    got = seven.read(ids)
    assert got == one.read(ids) == default.read(ids) == three.read(ids)  # ranges and readers agree
    assert len(set(got[:280])) == 280
    for i, rec in zip(ids[:40], got[:40]):
        assert len(record_stage.parse(rec, seven.specs)["inputs"]) == seven.lengths[i, 0]
    # Format 4 keeps no shard open; format 3 opened both through ArrayRecord readers.
    assert seven.max_open_shards == 0 and seven.stats()["shard_opens"] == seven.stats()["open_shards"] == 0
    assert three.stats()["shard_opens"] == 2 and three.max_open_shards >= 256
    for c in (seven, one, default, three):
        c.close()


def test_a_damaged_chunk_is_refused_with_the_shard_and_chunk_named(chunked, tmp_path):
    task, paths = chunked
    path = str(tmp_path / "det_a" / "train")
    shutil.copytree(paths[7], path)
    offset, length, _ = np.load(os.path.join(path, "chunks.npy"))[23]  # chunk 1 of shard 1
    shard = pathlib.Path(path, "shard-00001-of-00002.array_record")
    data = bytearray(shard.read_bytes())
    data[offset + length // 2] ^= 0x01  # same size: only the chunk's CRC-32 can tell
    shard.write_bytes(bytes(data))
    cache = CachedTask(path, task)
    assert len(cache.read(range(150, 157))) == 7  # chunk 0 of the shard is intact
    with pytest.raises(store.CacheIntegrityError, match=r"chunk 1 of shard-00001-of-00002.array_record .*checksum"):
        cache.read([158])
    cache.close()
    from cairn.datatasks.deterministic.verify import verify_task_cache

    index = pathlib.Path(path, "chunks.npy")
    index.write_bytes(index.read_bytes()[:-1] + b"\x01")  # the index too: same size, other bytes
    problems = verify_task_cache(path, task)
    assert [p.split(":")[0] for p in problems] == ["shard-00001-of-00002.array_record", "chunks.npy"], problems


def test_a_chunk_is_fetched_once_then_served_from_the_lru(chunked):
    task, paths = chunked
    cache = CachedTask(paths[7], task)
    first = cache.read(range(7, 14))  # chunk 1 of shard 0, whole
    assert cache.stats()["chunk_fetches"] == 1 and cache.stats()["chunk_hits"] == 0
    assert cache.read([13, 7, 9]) == [first[6], first[0], first[2]]
    assert cache.stats()["chunk_fetches"] == 1 and cache.stats()["chunk_hits"] == 1
    cache.read([6, 7, 150])  # chunks 0 and 22 are new, 1 is kept
    assert cache.stats()["chunk_fetches"] == 3 and cache.stats()["cached_chunk_bytes"] > 0
    cache.close()
    nothing_kept = CachedTask(paths[7], task, chunk_cache_bytes=0)
    nothing_kept.read(range(7, 14))
    assert nothing_kept.read(range(7, 14)) == first
    assert nothing_kept.stats()["chunk_fetches"] == 2 and nothing_kept.stats()["cached_chunk_bytes"] == 0
    nothing_kept.close()
    per_record = CachedTask(paths[1], task)  # group_size 1: a fetch per record, no LRU
    per_record.read([3, 4, 200])
    assert per_record.stats()["chunk_fetches"] == 3
    per_record.close()


def test_the_lengths_pages_leave_the_resident_set_and_rows_stay_right(chunked, monkeypatch):
    from cairn.datatasks.deterministic import cached_task

    task, paths = chunked
    cache = CachedTask(paths[7], task)
    want = np.load(os.path.join(paths[7], "lengths.npy"))
    monkeypatch.setattr(cached_task, "RELEASE_LENGTH_PAGES_EVERY", 100)
    released = []
    release = cache._release_length_pages
    monkeypatch.setattr(cache, "_release_length_pages", lambda: (released.append(1), release()))
    for at in range(0, 280, 60):
        ids = np.arange(at, min(at + 60, 280))[::-1]
        np.testing.assert_array_equal(cache.lengths_of(ids), want[ids])
    assert len(released) == 2  # at 120 and 240 rows looked up
    cache.close()


def test_a_format_3_cache_upgrades_in_place_to_what_format_4_writes(chunked, tmp_path):
    task, paths = chunked
    path = str(tmp_path / "det_a" / "train")
    shutil.copytree(paths["f3"], path)
    assert cache_writer.upgrade_in_place(path) == (
        f"cairn: upgraded {path} from cache format 3 to 4 in place (its chunk index, chunks.npy; no record rewritten)"
    )
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    assert info == json.loads(pathlib.Path(paths[7], "info.json").read_text())
    for name in ("chunks.npy", "info.json", "COMPLETED"):
        assert pathlib.Path(path, name).read_bytes() == pathlib.Path(paths[7], name).read_bytes(), name
    with pytest.raises(DataTasksError, match="is in format 4, not 3: add_chunk_index upgrades format 3 only"):
        cache_writer.add_chunk_index(path)
    assert cache_writer.upgrade_in_place(path) is None and cache_writer.upgrade_in_place("gs://b/x/train") is None


def test_open_shards_stay_within_the_bound_and_reads_stay_right(chunked, monkeypatch):
    """Formats 2 and 3 (no chunk index) read through ArrayRecord readers, K of them open."""
    task, paths = chunked
    reference = CachedTask(paths[1], task)
    cache = CachedTask(paths["f3"], task, chunk_cache_bytes=0, open_shards_bytes=1)
    assert cache.max_open_shards == 1
    opened = cache._open
    most = []

    def counting(shards):
        readers = opened(shards)
        most.append(len(cache._readers))
        return readers

    monkeypatch.setattr(cache, "_open", counting)
    for ids in ([0, 1], [200], [5, 279, 140, 150], [3], list(range(280))):
        assert cache.read(ids) == reference.read(ids)
        assert cache.stats()["open_shards"] <= 1
    assert max(most) == 1 and cache.stats()["shard_closes"] >= 4
    cache.close()
    reference.close()
    assert CachedTask(paths["f3"], task).max_open_shards >= 256  # the default budget, locally


def _as_format(path, version):
    """What format 3 wrote (no chunk index) or format 2 (one record per chunk, source order),
    as that format's files say it."""
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    info["format_version"] = version
    for k in ("chunks",) + (("group_size", "record_order", "shuffle_key") if version == 2 else ()):
        del info[k]
    os.remove(os.path.join(path, "chunks.npy"))
    pathlib.Path(path, "info.json").write_text(json.dumps(info))
    pathlib.Path(path, "COMPLETED").write_text(json.dumps({"format_version": version}) + "\n")


def test_a_format_2_cache_reads_as_it_is_and_is_re_cached_when_asked(chunked, tmp_path, capfd):
    task, paths = chunked
    path = str(tmp_path / "det_a" / "train")
    shutil.copytree(paths[1], path)
    _as_format(path, 2)
    assert store.cache_state(path) == "older" and not store.is_completed(path)
    old, new = CachedTask(path, task), CachedTask(paths[1], task)
    assert old.group_size == 1 and old.read(range(280)) == new.read(range(280))
    old.close()
    new.close()
    assert store.recache_notice(path) == (
        f"cairn: re-caching {path}: it was written in cache format 2; this version writes "
        f"format 4 (chunked shards with a chunk index: a chunk is one ranged read, no shard kept open)"
    )
    assert not cache_task_in_process(task, "train", path)  # readable: kept, with a notice
    assert "is in cache format 2" in capfd.readouterr().err
    assert cache_task_in_process(task, "train", path, overwrite=True)  # what the launcher does
    assert store.cache_state(path) == "complete" and store.recache_notice(path) is None


@pytest.fixture(scope="module")
def in_bucket(chunked, tmp_path_factory):
    """`(emulator, output_dir)`: the 7-records-a-chunk cache of det_a copied into a
    fake-gcs-server bucket (`<output_dir>/det_a/train`; format 3's in `<output_dir>/f3/...`)
    that this process reads."""
    from cairn import storage
    from cairn.storage.testing import GcsEmulator

    _, paths = chunked
    with pytest.MonkeyPatch.context() as mp, GcsEmulator() as emu:
        mp.setenv("CAIRN_CACHE_HOME", str(tmp_path_factory.mktemp("home")))
        emu.activate()
        output_dir = emu.create_bucket("chunked") + "/cache"
        for key, under in ((7, output_dir), ("f3", output_dir + "/f3")):
            for name in sorted(os.listdir(paths[key])):
                storage.copy_file(os.path.join(paths[key], name), f"{under}/det_a/train/{name}")
        yield emu, output_dir


def test_a_chunked_cache_reads_from_the_bucket_a_request_per_chunk(chunked, in_bucket):
    task, paths = chunked
    url = in_bucket[1] + "/det_a/train"
    remote, local = CachedTask(url, task), CachedTask(paths[7], task)
    old = CachedTask(in_bucket[1] + "/f3/det_a/train", task)  # format 3: ArrayRecord readers over HTTP
    assert remote.group_size == 7 and remote.max_open_shards == 0  # a ranged GET per chunk, nothing open
    assert 900 < old.max_open_shards <= 1024  # ~256 KB per open shard
    ids = [13, 7, 150, 279, 8, 0]  # chunks 1, 22, 40, 0
    assert remote.read(ids) == local.read(ids) == old.read(ids)
    assert remote.stats()["chunk_fetches"] == 4 and remote.stats()["shard_opens"] == 0
    assert remote.read(range(7, 14)) == local.read(range(7, 14))
    assert remote.stats()["chunk_fetches"] == 4  # chunk 1 again: from the LRU
    assert old.stats()["shard_opens"] == 2
    for c in (remote, local, old):
        c.close()


def test_four_hosts_reading_the_bucket_at_once_make_one_process_global_batches(chunked, in_bucket, det_env):
    """Issue 37 item 7 at a small size: 4 reader processes (hosts 0..3 of 4) read their shares
    of the same global batches from the bucket at once; put together, they are the batches
    one process reads."""
    import subprocess
    import sys

    import det_run

    emu, output_dir = in_bucket
    data_dir = det_env[0]
    steps, batch = 6, 8
    script = os.path.join(os.path.dirname(os.path.abspath(det_run.__file__)), "det_run.py")
    env = emu.environ(dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    children = [
        subprocess.Popen(
            [sys.executable, script, data_dir, output_dir, "det_a", "1", str(steps), str(h), "4", str(batch)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in range(4)
    ]
    try:
        outputs = [c.communicate(timeout=120) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    for c, (_, err) in zip(children, outputs):
        assert c.returncode == 0, err[-2000:]
    shares = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    whole = det_run.reader(data_dir, output_dir, "det_a", True, batch=batch, noisy=False, prefetch=0)
    for step in range(steps):
        rows = det_run.row_digests(next(whole))
        assert len(set(rows)) == batch  # packed rows of distinct records
        assert [r for share in shares for r in share[step]] == rows, step
        assert all(len(share[step]) == batch // 4 for share in shares)
    whole.close()


def test_concurrent_reads_from_the_bucket_share_fetches_and_keep_every_batch(chunked, in_bucket, det_env):
    """The prefetch threads' reads fetch at the same time (no lock held over a request): with one
    open shard allowed (format 3) or none (format 4) and no chunk kept, 8 threads reading
    overlapping records get the right bytes and leave nothing pinned; a reader with 6 passes of
    read-ahead gives the batches of a reader without any, step for step."""
    from concurrent.futures import ThreadPoolExecutor

    import det_run

    task, paths = chunked
    output_dir = in_bucket[1]
    local = CachedTask(paths[7], task)
    rng = np.random.default_rng(3)
    asks = [rng.integers(0, 280, 40) for _ in range(24)]
    want = [local.read(ids) for ids in asks]
    for under in (output_dir + "/f3", output_dir):
        remote = CachedTask(under + "/det_a/train", task, chunk_cache_bytes=0, open_shards_bytes=1)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(remote.read, asks))
        assert got == want
        stats = remote.stats()
        assert stats["open_shards"] <= 1 and stats["cached_chunk_bytes"] == 0
        assert not remote._users and not remote._inflight and not remote._opening
        remote.close()
    local.close()
    data_dir = det_env[0]
    ahead = det_run.reader(
        data_dir, output_dir, "det_a", True, batch=8, noisy=False, prefetch=6, steps_per_call=1, chunk_cache_bytes=4096
    )
    still = det_run.reader(data_dir, output_dir, "det_a", True, batch=8, noisy=False, prefetch=0, steps_per_call=1)
    # The default read-ahead: PREFETCH_AT_URL passes for a cache at a URL, PREFETCH locally.
    default = det_run.reader(data_dir, output_dir, "det_a", True, batch=8, noisy=False, steps_per_call=1)
    on_disk = det_run.reader(data_dir, paths[7].rsplit("/det_a/", 1)[0], "det_a", True, batch=8, noisy=False)
    assert (default._prefetch, on_disk._prefetch) == (reader_lib.PREFETCH_AT_URL, reader_lib.PREFETCH) == (8, 2)
    on_disk.close()
    for step in range(12):
        a, b, c = next(ahead), next(still), next(default)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), step
        assert all(np.array_equal(c[k], b[k]) for k in b), step
    ahead.close()
    still.close()
    default.close()
