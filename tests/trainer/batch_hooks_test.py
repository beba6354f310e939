"""`Trainer(batch_hooks=...)`: each step's global batch digests, before the step; a resumed
run sees the same fingerprints for the same steps."""

import hashlib

import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel, make_batch

from cairn.partitioning import row_digests
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig


def run(model_dir, steps, every=1):
    seen = {}
    cfg = TrainerConfig(model_dir=str(model_dir), num_train_steps=steps, log_every=2, tensorboard=False)
    trainer = Trainer(
        TinyModel(),
        OptimizerConfig(name="adamw"),
        1e-3,
        make_partitioner(4, 2),
        cfg,
        batch_hooks=[lambda step, d: seen.setdefault(step, d.fingerprint())],
        batch_hook_every=every,
    )
    trainer.train(CountingIterator())
    return seen


def test_batch_hooks_see_each_step_once_with_its_batch(tmp_path):
    seen = run(tmp_path / "a", 4)
    assert sorted(seen) == [1, 2, 3, 4]
    for step, fingerprint in seen.items():  # step s trains on the iterator's batch at position s - 1
        want = hashlib.sha256(row_digests(make_batch(0, step - 1)).tobytes()).hexdigest()
        assert fingerprint == want, step
    assert len(set(seen.values())) == 4


def test_resumed_run_sees_the_same_batches(tmp_path):
    straight = run(tmp_path / "straight", 4)
    first = run(tmp_path / "resumed", 2)
    rest = run(tmp_path / "resumed", 4)
    assert sorted(rest) == [3, 4]
    assert {**first, **rest} == straight


def test_batch_hook_every(tmp_path):
    straight = run(tmp_path / "every1", 5)
    every2 = run(tmp_path / "every2", 5, every=2)
    assert sorted(every2) == [2, 4] and every2 == {s: straight[s] for s in (2, 4)}


def test_hooks_must_be_callable(tmp_path):
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=1)
    with pytest.raises(TypeError, match="batch_hooks"):
        Trainer(TinyModel(), OptimizerConfig(), 1e-3, make_partitioner(8, 1), cfg, batch_hooks=[3])
    with pytest.raises(ValueError, match="batch_hook_every must be an int >= 1"):
        Trainer(TinyModel(), OptimizerConfig(), 1e-3, make_partitioner(8, 1), cfg, batch_hook_every=0)
