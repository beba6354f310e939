"""A NaN loss stops the run with the step, keeps the last good checkpoint (none if it came before
the first) and every finite step's metrics row. (SIGTERM and two runs on one model_dir, in child
processes: reproducibility_test.)"""

import json

import numpy as np
import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import Checkpointer, NonFiniteLossError, OptimizerConfig, Trainer, TrainerConfig


def _loss_steps(model_dir) -> list:
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return sorted(r["step"] for r in rows if r["task"] == "train" and r["metric"] == "loss")


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
    assert _loss_steps(tmp_path) == list(range(1, 8))  # every step before the NaN keeps its row
    assert all(np.isfinite(np.asarray(x)).all() for x in __import__("jax").tree.leaves(state.params))
    assert not (tmp_path / "cairn.lock").exists()


def test_nan_right_before_a_checkpoint_is_not_saved(tmp_path):
    cfg = TrainerConfig(
        model_dir=str(tmp_path), num_train_steps=20, checkpoint_every=4, log_every=100, tensorboard=False
    )
    # The same program as the test above (the poison is in the data): compiled once.
    trainer = Trainer(TinyModel(nan_at_step=3), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg)
    with pytest.raises(
        NonFiniteLossError, match="loss is nan at step 4; training stopped and no checkpoint was written"
    ):
        trainer.train(CountingIterator(poison_at=3))
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.all_steps() == []
    finally:
        ckpt.close()
    rows = [json.loads(line) for line in open(tmp_path / "summaries" / "metrics.jsonl")]
    assert all(np.isfinite(r["value"]) for r in rows)
    # Every step before the NaN keeps its loss row (the run ends before any log or checkpoint).
    assert _loss_steps(tmp_path) == [1, 2, 3]
