"""Checkpoints: restore across meshes, params-only, corrupt latest, retention, the model_dir lock."""

import json
import logging
import os

import jax
import numpy as np
import pytest
from mesh_util import make_partitioner
from tiny_model import TinyModel, make_batch

from cairn.trainer import (
    CheckpointConfig,
    Checkpointer,
    CorruptCheckpointError,
    ModelDirLock,
    ModelDirLockedError,
    NoCheckpointError,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    restore_params,
    stored_params,
)


def _trainer(tmp_path, shape):
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=2)
    t = Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(*shape), cfg)
    t.setup(make_batch(0, 0))
    return t


def _trained_state(t, steps=2):
    state = t.initial_state()
    for i in range(steps):
        state, _ = t.train_step(state, t.partitioner.shard_batch(make_batch(0, i)))
    return state


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two checkpoints (steps 1 and 2) saved on a (4, 2) mesh."""
    d = tmp_path_factory.mktemp("saved")
    t = _trainer(d, (4, 2))
    ckpt = Checkpointer(d)
    state = t.initial_state()
    for i in range(2):
        state, _ = t.train_step(state, t.partitioner.shard_batch(make_batch(0, i)))
        ckpt.save(i + 1, state, {"position": i + 1}, {"experiment": "x"})
    ckpt.close()
    return d, jax.device_get(state)


@pytest.mark.parametrize("shape", [(8, 1), (1, 8), (4, 2)], ids=["8x1", "1x8", "4x2"])
def test_restore_onto_another_mesh(saved, shape, tmp_path):
    d, expected = saved
    t = _trainer(tmp_path, shape)
    ckpt = Checkpointer(d)
    try:
        step, state, data, config = ckpt.restore(t.abstract_state)
    finally:
        ckpt.close()
    assert step == 2 and data == {"position": 2} and config == {"experiment": "x"}
    _assert_trees_equal(state, expected)
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(t.state_shardings)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    # The restored state trains on the new mesh.
    t.train_step(state, t.partitioner.shard_batch(make_batch(0, 2)))


def test_params_only_restore_with_dtype_cast(saved, tmp_path):
    d, expected = saved
    t = _trainer(tmp_path, (8, 1))
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, "bfloat16", sharding=a.sharding), t.abstract_state.params
    )
    params = restore_params(d, abstract)
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(params))
    # What the checkpoint holds, from its metadata: the saved (float32) params' shapes.
    assert stored_params(d) == jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), expected.params)
    np.testing.assert_allclose(np.asarray(params["wi"], np.float32), expected.params["wi"], rtol=1e-2)
    # Fine-tuning starts from them: step 0, fresh optimizer state.
    fresh = t.initial_state(jax.tree.map(lambda x: x.astype("float32"), params))
    assert int(fresh.step) == 0


def test_corrupt_latest_checkpoint_falls_back_to_previous(saved, tmp_path, caplog):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(saved[0], d)
    victim = max(
        (p for p in (d / "checkpoints" / "2" / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    t = _trainer(tmp_path / "t", (4, 2))
    ckpt = Checkpointer(d)
    with pytest.raises(CorruptCheckpointError, match="corrupt"):
        ckpt.verify(2)
    with caplog.at_level(logging.WARNING):
        step, state, data, _ = ckpt.restore(t.abstract_state)
    ckpt.close()
    assert step == 1 and data == {"position": 1}
    assert "step 2 is unusable" in caplog.text and victim.name in caplog.text
    assert (d / "corrupt_checkpoints" / "2").is_dir() and not (d / "checkpoints" / "2").exists()


def test_unreadable_checkpoint_without_manifest_falls_back(saved, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(saved[0], d)
    shutil.rmtree(d / "manifests")
    (d / "checkpoints" / "2" / "state" / "_METADATA").write_bytes(b"{garbage")
    t = _trainer(tmp_path / "t", (4, 2))
    ckpt = Checkpointer(d)
    step, _, _, _ = ckpt.restore(t.abstract_state)
    ckpt.close()
    assert step == 1


def test_no_checkpoint_is_a_clear_error(tmp_path):
    t = _trainer(tmp_path / "t", (4, 2))
    ckpt = Checkpointer(tmp_path / "empty")
    with pytest.raises(NoCheckpointError, match="no usable checkpoint"):
        ckpt.restore(t.abstract_state)
    ckpt.close()
    with pytest.raises(NoCheckpointError):
        restore_params(tmp_path / "empty", t.abstract_state.params)


def test_keep_last_k_and_best_by_metric(tmp_path):
    t = _trainer(tmp_path / "t", (4, 2))
    state = _trained_state(t, 1)
    ckpt = Checkpointer(tmp_path / "m", CheckpointConfig(keep=2, best_metric="loss", best_mode="min"))
    for step, loss in zip(range(1, 6), [5.0, 1.0, 4.0, 3.0, 2.0]):
        ckpt.save(step, state, metrics={"loss": loss})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 4, 5]  # the last two, and the best (loss 1.0)
    ckpt.close()
    manifests = sorted(p.stem for p in (tmp_path / "m" / "manifests").glob("*.json"))
    assert manifests == ["2", "4", "5"]


def test_second_writer_gets_a_clear_error(tmp_path):
    with ModelDirLock(tmp_path):
        with pytest.raises(ModelDirLockedError, match=f"in use by pid {os.getpid()}"):
            ModelDirLock(tmp_path).acquire()
    ModelDirLock(tmp_path).acquire().release()  # released: free again


def test_stale_lock_of_dead_process_is_taken_over(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=60
    )
    (tmp_path / "cairn.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    lock = ModelDirLock(tmp_path).acquire()
    assert json.loads((tmp_path / "cairn.lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "cairn.lock").exists()


def test_save_dtype_casts_params_and_restore_casts_back(tmp_path):
    t = _trainer(tmp_path / "t", (4, 2))
    state = _trained_state(t, 1)
    ckpt = Checkpointer(tmp_path / "m", CheckpointConfig(save_dtype="bfloat16", asynchronous=False))
    ckpt.save(1, state)
    try:
        _, restored, _, _ = ckpt.restore(t.abstract_state)
    finally:
        ckpt.close()
    assert restored.params["wi"].dtype == np.float32
    expected = np.asarray(state.params["wi"]).astype(jax.numpy.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(restored.params["wi"]), expected)
    _assert_trees_equal(restored.opt_state, state.opt_state)  # the optimizer state is not cast


def test_orbax_barriers_go_through_the_distributed_client():
    """Background saves on several processes need orbax's barriers off the device collectives."""
    from orbax.checkpoint._src.multihost import multihost

    from cairn.trainer.checkpoints import use_client_barriers

    assert use_client_barriers() is True
    assert multihost.EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER.value is True
