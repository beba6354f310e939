"""Checkpoint faults: SHA-256 manifests catch a same-size corruption; every checkpoint corrupt is
refused (or, asked, moved aside for a restart), a bucket down at restore is not taken for one; a
full disk is one `DiskFullError` soon after the failed save, the last good checkpoint intact; the
lock names its holder and age."""

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn import storage
from cairn.trainer import (
    AllCheckpointsCorruptError,
    CheckpointConfig,
    Checkpointer,
    CorruptCheckpointError,
    DiskFullError,
    ModelDirLock,
    ModelDirLockedError,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    checkpoints,
    faults,
)


def _trainer(model_dir, steps, **checkpoint):
    cfg = TrainerConfig(
        model_dir=str(model_dir),
        num_train_steps=steps,
        checkpoint_every=2,
        log_every=100,
        tensorboard=False,
        checkpoint=CheckpointConfig(**checkpoint),
    )
    return Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run trained to step 4, checkpoints at steps 2 and 4."""
    d = tmp_path_factory.mktemp("run")
    _trainer(d, 4).train(CountingIterator())
    assert sorted(os.listdir(d / "checkpoints")) == ["2", "4"]
    return d


def _copy(saved, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(saved, d)
    (d / "cairn.lock").unlink(missing_ok=True)
    return d


def _flip_a_byte(model_dir, step):
    """Flips one byte in the middle of the step's largest state file (same size); its path
    relative to the step's folder."""
    root = model_dir / "checkpoints" / str(step)
    victim = max((p for p in (root / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim.relative_to(root).as_posix()


def test_manifest_holds_size_and_sha256_of_every_file(saved):
    manifest = json.loads((saved / "manifests" / "4.json").read_text())
    root = saved / "checkpoints" / "4"
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        data = (root / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_same_size_corruption_falls_back_with_a_warning_naming_the_file(saved, tmp_path, caplog):
    d = _copy(saved, tmp_path)
    name = _flip_a_byte(d, 4)
    t = _trainer(d, 4)
    ckpt = Checkpointer(d)
    try:
        with pytest.raises(CorruptCheckpointError, match=re.escape(name) + r" \(same size, other bytes"):
            ckpt.verify(4)
        t.setup(next(CountingIterator()))
        with caplog.at_level(logging.WARNING, logger="cairn"):
            step, state, data, _ = ckpt.restore(t.abstract_state)
    finally:
        ckpt.close()
    assert step == 2 and data == {"position": 2}
    assert "step 4 is unusable" in caplog.text and name in caplog.text
    assert (d / "corrupt_checkpoints" / "4").is_dir() and sorted(os.listdir(d / "checkpoints")) == ["2"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


def test_every_checkpoint_corrupt_is_refused_and_nothing_is_moved(saved, tmp_path):
    d = _copy(saved, tmp_path)
    names = {step: _flip_a_byte(d, step) for step in (2, 4)}
    for _ in range(2):  # a rerun is refused the same way: never a silent restart from step 0
        with pytest.raises(AllCheckpointsCorruptError) as caught:
            _trainer(d, 6).train(CountingIterator())
        message = str(caught.value)
        assert "\n" not in message and "restart_if_corrupt" in message
        assert f"step 4: checkpoint {d / 'checkpoints' / '4'} is corrupt: {names[4]}" in message
        assert f"step 2: checkpoint {d / 'checkpoints' / '2'} is corrupt: {names[2]}" in message
        assert caught.value.steps == [4, 2]
        assert sorted(os.listdir(d / "checkpoints")) == ["2", "4"] and not (d / "corrupt_checkpoints").exists()
    assert not (d / "cairn.lock").exists()


def test_a_bucket_down_at_restore_is_no_corrupt_checkpoint(saved, tmp_path, monkeypatch):
    """A restore whose reads ran out of retries (tensorstore's words for it) raises
    `StorageUnavailableError` naming the bucket and the step: nothing is taken for corrupt or
    moved aside, and the outage is recorded for the process."""
    from cairn.storage import retries

    d = _copy(saved, tmp_path)
    t = _trainer(d, 4)
    ckpt = Checkpointer(d)

    def down(step, abstract_state):
        raise ValueError("ABORTED: All 13 retry attempts failed: service unavailable [http_response_code='503']")

    monkeypatch.setattr(ckpt, "_restore_step", down)
    try:
        t.setup(next(CountingIterator()))
        with pytest.raises(storage.StorageUnavailableError) as caught:
            ckpt.restore(t.abstract_state)
        assert caught.value.operation == "restoring step 4" and "All 13 retry attempts failed" in str(caught.value)
        assert retries.declared_outage() is caught.value
    finally:
        retries.reset_outage()
        ckpt.close()
    assert sorted(os.listdir(d / "checkpoints")) == ["2", "4"] and not (d / "corrupt_checkpoints").exists()


def test_restart_if_corrupt_moves_them_aside_and_starts_from_step_0(saved, tmp_path, caplog):
    d = _copy(saved, tmp_path)
    for step in (2, 4):
        _flip_a_byte(d, step)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        result = _trainer(d, 2, restart_if_corrupt=True).train(CountingIterator())
    assert result.step == 2 and "starting again from step 0" in caplog.text
    assert sorted(os.listdir(d / "corrupt_checkpoints")) == ["2", "4"]
    # One history: the discarded timeline's rows (steps 1-4) moved aside, marked; the new run's
    # steps 1-2 are the only rows left, one per (task, step, metric).
    rows = storage.read_json_lines(d / "summaries" / "metrics.jsonl")[0]
    keys = [(r["task"], r["step"], r["metric"]) for r in rows]
    assert len(keys) == len(set(keys)) and {r["step"] for r in rows} == {1, 2}
    aside = storage.read_json_lines(d / "superseded" / "summaries" / "metrics.jsonl")[0]
    assert {r["step"] for r in aside} == {1, 2, 3, 4} and {r["superseded_after_step"] for r in aside} == {0}
    ckpt = Checkpointer(d)
    try:
        assert ckpt.all_steps() == [2]
        ckpt.verify(2)  # the new step 2, with its own manifest
    finally:
        ckpt.close()


def test_checkpoints_moved_aside_by_an_earlier_run_are_no_silent_restart(saved, tmp_path):
    d = _copy(saved, tmp_path)
    (d / "corrupt_checkpoints").mkdir()
    for step in ("2", "4"):
        shutil.move(d / "checkpoints" / step, d / "corrupt_checkpoints" / step)
    with pytest.raises(AllCheckpointsCorruptError, match="moved to .*corrupt_checkpoints by an earlier run"):
        _trainer(d, 6).train(CountingIterator())


class _SlowIterator(CountingIterator):
    def __next__(self):
        time.sleep(0.05)
        return super().__next__()


def test_disk_full_in_a_background_save_stops_the_run_at_once(tmp_path, monkeypatch):
    """The fault is injected into orbax's save of step 4 (OSError ENOSPC, as a full disk raises)."""
    real_save = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step >= 4:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoints"))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    # The free space is measured when the save failed, before its partial step is removed (which
    # gives space back): the first measurement is the one the line reports.
    measured = iter([1 << 20])
    monkeypatch.setattr(checkpoints, "free_space", lambda path: next(measured, 9 << 30))
    data = _SlowIterator()
    with pytest.raises(DiskFullError) as caught:
        _trainer(tmp_path, 100).train(data)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"no space left on device writing checkpoint step 4 in {tmp_path} (1.0 MiB free)")
    assert message.endswith("the last good checkpoint (step 2) is intact")
    assert caught.value.errno == errno.ENOSPC
    assert data.position <= 8  # surfaced within a few steps, not at the next save or the end
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.all_steps() == [2]
        ckpt.verify(2)
    finally:
        ckpt.close()


@pytest.mark.parametrize(
    "error, code, words",
    [
        (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC, "no space left on device writing"),
        (
            ValueError("OUT_OF_RANGE: Failed to write: File too large [os_error_code='27']"),
            errno.EFBIG,
            "file too large",
        ),
        (ValueError("RESOURCE_EXHAUSTED: ... Disk quota exceeded"), errno.EDQUOT, "disk quota exceeded"),
        (PermissionError(errno.EACCES, "Permission denied"), errno.EACCES, "permission denied writing"),
        (ValueError("OUT_OF_RANGE: index 7"), None, None),
    ],
)
def test_a_write_the_storage_refuses_is_recognised_and_named(tmp_path, monkeypatch, error, code, words):
    """tensorstore's errors are ValueErrors carrying the errno as text; a cause is followed."""
    monkeypatch.setattr(faults, "file_size_limit", lambda: 10 << 20)
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = error
    assert faults.write_failure_code(wrapped) == code
    if code is None:
        return
    message = str(faults.write_failure(str(tmp_path), "checkpoint step 4", 2, code))
    assert message.startswith(f"{words}") and f" checkpoint step 4 in {tmp_path}" in message
    assert message.endswith("the last good checkpoint (step 2) is intact") and "\n" not in message
    if code == errno.EFBIG:
        assert f"in {tmp_path} (over this process's file size limit of 10.0 MiB: ulimit -f); " in message


def test_lock_refusal_names_the_holders_host_pid_and_age(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock_file = tmp_path / "cairn.lock"
        lock_file.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "time": time.time() - 125}))
        for attempt in (ModelDirLock(tmp_path).check_free, ModelDirLock(tmp_path).acquire):
            with pytest.raises(ModelDirLockedError) as caught:
                attempt()
            message = str(caught.value)
            assert f"in use by pid {holder.pid} on host {socket.gethostname()} (taken 2m " in message
            assert re.search(r"taken 2m \d+s ago", message) and "\n" not in message
        assert json.loads(lock_file.read_text())["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_taken_before_training_is_handed_to_the_trainer(tmp_path):
    lock = ModelDirLock(tmp_path).acquire()  # as the train launcher does before writing config.json
    try:
        with pytest.raises(ModelDirLockedError):
            _trainer(tmp_path, 2).train(CountingIterator())
        assert _trainer(tmp_path, 2).train(CountingIterator(), model_dir_lock=lock).step == 2
        assert lock.held and json.loads((tmp_path / "cairn.lock").read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not (tmp_path / "cairn.lock").exists()
