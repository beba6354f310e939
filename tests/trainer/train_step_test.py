"""The partitioned train step: accumulation, dropout keys, optimizer-state shardings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from conftest import make_partitioner
from tiny_model import TinyModel, make_batch

from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig, dropout_key


def _trainer(tmp_path, num_microbatches=1, dropout=0.0, shape=(4, 2), optimizer=OptimizerConfig(), reduction="mean"):
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=4, num_microbatches=num_microbatches,
                        microbatch_reduction=reduction)
    return Trainer(TinyModel(dropout=dropout, reduction=reduction), optimizer, 0.01, make_partitioner(*shape), cfg)


def _run(trainer, batches):
    trainer.setup(batches[0])
    state = trainer.initial_state()
    losses = []
    for b in batches:
        state, m = trainer.train_step(state, trainer.partitioner.shard_batch(b))
        losses.append(float(m["loss"]))
    return state, losses


@pytest.mark.parametrize("optimizer,reduction", [(OptimizerConfig(), "mean"), (OptimizerConfig(name="adamw"), "mean"),
                                                (OptimizerConfig(), "sum")], ids=["adafactor", "adamw", "sum-loss"])
def test_four_microbatches_match_one_full_batch_step(tmp_path, optimizer, reduction):
    batches = [make_batch(0, i, batch_size=32) for i in range(2)]
    full, full_losses = _run(_trainer(tmp_path, 1, optimizer=optimizer, reduction=reduction), batches)
    acc, acc_losses = _run(_trainer(tmp_path, 4, optimizer=optimizer, reduction=reduction), batches)
    np.testing.assert_allclose(acc_losses, full_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(full.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def test_microbatches_must_divide_the_batch(tmp_path):
    t = _trainer(tmp_path, 3)
    b = make_batch(0, 0, batch_size=16)
    t.setup(b)
    with pytest.raises(ValueError, match="not divisible by num_microbatches=3"):
        t.train_step(t.initial_state(), t.partitioner.shard_batch(b))


def test_dropout_key_is_fold_in_of_seed_and_step(tmp_path):
    seed = jax.random.PRNGKey(3)
    assert np.array_equal(dropout_key(seed, jnp.int32(7)), jax.random.fold_in(seed, 7))
    # Same step and state twice: same loss; the next step (other key) differs on the same batch.
    t = _trainer(tmp_path, dropout=0.5)
    b = make_batch(0, 0)
    t.setup(b)
    s0 = t.initial_state()
    gb = t.partitioner.shard_batch(b)
    _, m1 = t.train_step(s0, gb)
    _, m2 = t.train_step(s0, gb)
    _, m3 = t.train_step(s0.replace(step=s0.step + 1), gb)
    assert float(m1["loss"]) == float(m2["loss"])
    assert float(m1["loss"]) != float(m3["loss"])


def test_factored_adafactor_state_shardings(tmp_path):
    t = _trainer(tmp_path, shape=(4, 2))
    b = make_batch(0, 0)
    t.setup(b)
    state = t.initial_state()
    fs = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "v_row")) if hasattr(s, "v_row")][0]
    # wi (embed, mlp) is 128 x 256: factored, its row/column statistics replicated.
    assert fs.v_row["wi"].sharding.is_fully_replicated
    assert fs.v_col["wi"].sharding.is_fully_replicated
    # scale (embed,) is not factored: v is shaped like it and sharded like it.
    assert fs.v["scale"].sharding == state.params["scale"].sharding
    assert state.params["wi"].sharding.spec == PartitionSpec(None, "model")
    assert fs.count.sharding.is_fully_replicated


def test_adamw_moments_sharded_like_params(tmp_path):
    t = _trainer(tmp_path, shape=(2, 4), optimizer=OptimizerConfig(name="adamw"))
    t.setup(make_batch(0, 0))
    state = t.initial_state()
    adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu")][0]
    for name in ("wi", "wo", "embedding"):
        assert adam.mu[name].sharding == state.params[name].sharding
        assert adam.nu[name].sharding == state.params[name].sharding
