"""SIGTERM saves and exits 0; two runs on one model_dir; NaN stops with the step (subprocesses and in-process)."""

import json
import signal

import numpy as np
import pytest
from mesh_util import make_partitioner
from subprocess_util import wait_for_line, worker
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import Checkpointer, NonFiniteLossError, OptimizerConfig, Trainer, TrainerConfig


def test_sigterm_finishes_the_step_saves_and_exits_0(tmp_path):
    with worker(tmp_path, 1000, "--checkpoint_every", 0, "--sleep", 0.05) as proc:
        wait_for_line(proc, "READY", timeout=120)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    assert "preempted=True" in out
    step = int(out.split("DONE step=")[1].split()[0])
    assert 1 <= step < 1000
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.latest_step() == step
    finally:
        ckpt.close()
    assert not (tmp_path / "cairn.lock").exists()


def test_second_run_on_the_same_model_dir_is_refused(tmp_path):
    with worker(tmp_path, 1000, "--checkpoint_every", 0, "--sleep", 0.05) as proc:
        wait_for_line(proc, "READY", timeout=120)
        cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=2, tensorboard=False)
        trainer = Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(8, 1), cfg)
        with pytest.raises(Exception, match=f"in use by pid {proc.pid}"):
            trainer.train(CountingIterator())
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = TrainerConfig(
        model_dir=str(tmp_path), num_train_steps=20, checkpoint_every=3, log_every=100, tensorboard=False
    )
    trainer = Trainer(TinyModel(nan_at_step=7), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg)
    # Batch position 7 is poisoned: it is trained in step 8 (steps count from 1).
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 8; .*last good checkpoint \\(step 6\\)"):
        trainer.train(CountingIterator(poison_at=7))
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.all_steps() == [3, 6]
        step, state, data, _ = ckpt.restore(trainer.abstract_state)
    finally:
        ckpt.close()
    assert step == 6 and data == {"position": 6}
    assert all(np.isfinite(np.asarray(x)).all() for x in __import__("jax").tree.leaves(state.params))
    assert not (tmp_path / "cairn.lock").exists()


def test_nan_right_before_a_checkpoint_is_not_saved(tmp_path):
    cfg = TrainerConfig(
        model_dir=str(tmp_path), num_train_steps=20, checkpoint_every=4, log_every=100, tensorboard=False
    )
    trainer = Trainer(TinyModel(nan_at_step=3), OptimizerConfig(), 0.01, make_partitioner(8, 1), cfg)
    with pytest.raises(
        NonFiniteLossError, match="loss is nan at step 4; training stopped and no checkpoint was written"
    ):
        trainer.train(CountingIterator(poison_at=3))
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.all_steps() == []
    finally:
        ckpt.close()
    rows = (
        [json.loads(line) for line in open(tmp_path / "summaries" / "metrics.jsonl")]
        if (tmp_path / "summaries" / "metrics.jsonl").exists()
        else []
    )
    assert all(np.isfinite(r["value"]) for r in rows)
