"""Start-up reads metadata only (sizes, not bytes); `verify_cache` reads everything and names
what differs; caches of the older format are refused with a clear error (or re-cached)."""

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
    CacheFormatError,
    CacheIntegrityError,
    CacheMismatchError,
    DeterministicReader,
    cache_state,
    cache_task_in_process,
    fingerprint,
    store,
    task_dir,
    verify_cache,
)
from cairn.datatasks.deterministic.verify import report

HERE = os.path.dirname(os.path.abspath(__file__))
SHARD = "shard-00000-of-00001.array_record"


@pytest.fixture
def fresh(tmp_path):
    """`(data_dir, cache_dir, registry, task det_b)`: a private copy of the sources and a
    private cache of det_b, free to damage."""
    data_dir, cache_dir = tmp_path / "data", tmp_path / "cache"
    registry = dt.Registry()
    _, task, _ = det_tasks.make(str(data_dir), registry)
    assert cache_task_in_process(task, "train", task_dir(str(cache_dir), "det_b", "train"))
    return str(data_dir), str(cache_dir), registry, task


def _reader(cache_dir, registry, **kwargs):
    return DeterministicReader(
        "det_b", cache_dir, 0, 4, det_tasks.LENGTHS, dt.EncDecFeatureConverter(pack=True), registry=registry, **kwargs
    )


def _flip_byte(path, at):
    raw = bytearray(pathlib.Path(path).read_bytes())
    raw[at] ^= 0x40
    pathlib.Path(path).write_bytes(bytes(raw))


def test_start_up_reads_no_record_and_no_source_byte(fresh, monkeypatch):
    _, cache_dir, registry, _ = fresh

    def forbidden(*args, **kwargs):
        raise AssertionError("start-up read the bytes of a file")

    monkeypatch.setattr(store, "open_read", forbidden)
    monkeypatch.setattr(fingerprint, "file_digest", forbidden)
    reader = _reader(cache_dir, registry)
    assert reader.streams[0].cache.num_records == 90
    assert isinstance(reader.streams[0].cache.lengths, np.memmap)
    reader.close()


def test_all_matches(fresh):
    _, cache_dir, registry, task = fresh
    assert verify_cache(cache_dir, task) == {"det_b": []}
    assert verify_cache(cache_dir, "det_.*", registry=registry) == {
        "det_a": [f"no cache at {task_dir(cache_dir, 'det_a', 'train')}"],
        "det_b": [],
    }
    assert verify_cache(cache_dir, "det_mix", registry=registry)["det_b"] == []


def test_a_flipped_byte_passes_start_up_and_fails_verify_cache(fresh):
    _, cache_dir, registry, task = fresh
    path = task_dir(cache_dir, "det_b", "train")
    size = os.path.getsize(os.path.join(path, SHARD))
    _flip_byte(os.path.join(path, SHARD), size // 2)
    assert os.path.getsize(os.path.join(path, SHARD)) == size
    CachedTask(path, task).close()  # same size: start-up cannot tell, and does not read it
    problems = verify_cache(cache_dir, task)["det_b"]
    assert len(problems) == 1
    assert problems[0].startswith(f"{SHARD}: content differs from info.json")


def test_stored_plans_are_verified(fresh):
    """A packed reader stores its plan beside the cache; `verify_cache` re-hashes it and names a
    corrupt or missing array (deleting the plans is the fix: they are rebuilt)."""
    _, cache_dir, registry, task = fresh
    reader = _reader(cache_dir, registry)
    key = reader.streams[0].plan_key
    reader.close()
    assert verify_cache(cache_dir, task) == {"det_b": []}
    plans = pathlib.Path(task_dir(cache_dir, "det_b", "train")) / "plans"
    starts = plans / f"{key}.starts.npy"
    _flip_byte(starts, starts.stat().st_size - 1)
    problems = verify_cache(cache_dir, task)["det_b"]
    assert problems == [
        f"plans/{key}.starts.npy: differs from its record {key}.json (corrupt); delete {plans} "
        f"(plans are rebuilt on the next start)"
    ]
    starts.unlink()
    assert verify_cache(cache_dir, task)["det_b"][0].startswith(f"plans/{key}.starts.npy: missing; delete")


def test_a_truncated_or_missing_shard_fails_start_up_suggesting_verify_cache(fresh):
    _, cache_dir, registry, task = fresh
    path = task_dir(cache_dir, "det_b", "train")
    with open(os.path.join(path, SHARD), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(path, SHARD)) - 7)
    with pytest.raises(
        CacheIntegrityError,
        match=rf"{SHARD} has \d+ bytes, info.json recorded \d+ .*verify_cache -- "
        rf"--cache_dir={cache_dir} --tasks=det_b --split=train",
    ):
        _reader(cache_dir, registry)
    assert verify_cache(cache_dir, task)["det_b"][0].startswith(f"{SHARD}: ")
    os.remove(os.path.join(path, SHARD))
    with pytest.raises(CacheIntegrityError, match=f"{SHARD} is missing"):
        CachedTask(path, task)
    assert verify_cache(cache_dir, task)["det_b"] == [f"{SHARD}: missing"]


def test_a_changed_source_file_is_named(fresh):
    data_dir, cache_dir, registry, task = fresh
    path = task_dir(cache_dir, "det_b", "train")
    source = os.path.join(data_dir, "b0.txt")
    _flip_byte(source, 3)  # same size: start-up compares names and sizes only
    CachedTask(path, task).close()
    problems = verify_cache(cache_dir, task)["det_b"]
    assert problems == [problems[0]] and problems[0].startswith(
        "source file 'b0.txt' (pattern 0) content changed since it was cached"
    )
    with open(source, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with pytest.raises(
        CacheMismatchError,
        match=r"source file 'b0.txt' \(pattern 0\) has "
        r"\d+ bytes, the cache recorded \d+",
    ):
        CachedTask(path, task)
    CachedTask(path, task, check_source_files=False).close()  # the cache as it is
    os.rename(source, os.path.join(data_dir, "b1.txt"))
    problems = verify_cache(cache_dir, task)["det_b"]
    assert problems == [
        "source file 'b0.txt' (pattern 0) was cached but is gone (removed or renamed)",
        "source file 'b1.txt' (pattern 0) is new (added or renamed): not in the cache",
    ]


def _make_format_1(path):
    """What the first format left: COMPLETED says `ok`, no sizes or checksums."""
    pathlib.Path(path, "COMPLETED").write_text("ok\n")
    info = json.loads(pathlib.Path(path, "info.json").read_text())
    info["format_version"] = 1
    for s in info["shards"]:
        del s["bytes"], s["sha256"]
    del info["lengths"], info["source"]
    pathlib.Path(path, "info.json").write_text(json.dumps(info))


def test_a_cache_of_the_older_format_is_refused_or_re_cached(fresh):
    _, cache_dir, registry, task = fresh
    path = task_dir(cache_dir, "det_b", "train")
    _make_format_1(path)
    assert cache_state(path) == "outdated" and not store.is_completed(path)
    with pytest.raises(
        CacheFormatError,
        match=r"format 1 .* reads formats 2, 3, 4 .*Re-cache it: "
        r"delete it .*--overwrite",
    ):
        _reader(cache_dir, registry)
    with pytest.raises(CacheFormatError, match="--overwrite"):
        cache_task_in_process(task, "train", path)  # not silently kept, not overwritten
    assert verify_cache(cache_dir, task)["det_b"] == [
        "written in format 1; this version reads formats 2, 3, 4: re-cache it (--overwrite)"
    ]
    # What `ensure_cached` in the launchers does with a cache that is not complete.
    assert cache_task_in_process(task, "train", path, overwrite=True)
    assert cache_state(path) == "complete"
    assert next(_reader(cache_dir, registry))["encoder_input_tokens"].shape == (4, 48)


def test_report_lines():
    out = []

    class Sink:
        def write(self, s):
            out.append(s)

    assert report({"a": [], "b": ["x: bad", "y: bad"]}, "train", Sink()) == 2
    assert "".join(out).splitlines() == ["a/train: ok", "b/train: x: bad", "b/train: y: bad"]
    assert report({"a": []}, "train", Sink()) == 0


def test_cache_dir_copied_elsewhere_still_opens(fresh, tmp_path):
    """Shards are named relative to the cache directory: a copied cache opens as it is."""
    _, cache_dir, registry, task = fresh
    moved = tmp_path / "moved"
    shutil.copytree(cache_dir, moved)
    reader = _reader(str(moved), registry)
    assert next(reader)["decoder_target_tokens"].shape == (4, 16)
    assert verify_cache(str(moved), task) == {"det_b": []}
