"""The partitioned train step: accumulation, dropout keys, optimizer-state shardings (after a
real step and after a checkpoint restore)."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from mesh_util import make_partitioner
from tiny_model import TinyModel, make_batch

from cairn.partitioning import IndivisibleDimensionWarning, Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import Checkpointer, OptimizerConfig, Trainer, TrainerConfig, dropout_key, opt_state_specs


def _trainer(tmp_path, num_microbatches=1, dropout=0.0, shape=(4, 2), optimizer=OptimizerConfig(), reduction="mean"):
    cfg = TrainerConfig(
        model_dir=str(tmp_path), num_train_steps=4, num_microbatches=num_microbatches, microbatch_reduction=reduction
    )
    return Trainer(TinyModel(dropout=dropout, reduction=reduction), optimizer, 0.01, make_partitioner(*shape), cfg)


def _run(trainer, batches):
    trainer.setup(batches[0])
    state = trainer.initial_state()
    losses = []
    for b in batches:
        state, m = trainer.train_step(state, trainer.partitioner.shard_batch(b))
        losses.append(float(m["loss"]))
    return state, losses


@pytest.mark.parametrize(
    "optimizer,reduction",
    [(OptimizerConfig(), "mean"), (OptimizerConfig(name="adamw"), "mean"), (OptimizerConfig(), "sum")],
    ids=["adafactor", "adamw", "sum-loss"],
)
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


# -- optimizer-state shardings -----------------------------------------------------------------
# One param per case of the rule. optax's Adafactor factors a param whose two largest dims are
# >= 128: v_row drops the largest, v_col the second largest; smaller params keep a full `v`.
SHAPES = {
    "embedding": ((256, 128), ("vocab", "embed")),  # v_row (embed,), v_col (vocab,)
    "wi": ((128, 256), ("embed", "mlp")),  # v_row (embed,), v_col (mlp,)
    "stack": ((2, 128, 256), ("layers", "embed", "mlp")),  # scanned: v_row (layers, embed), v_col (layers, mlp)
    "square": ((128, 128), ("embed", "mlp")),  # which dim was dropped is ambiguous: replicated
    "odd": ((128, 132), ("embed", "mlp")),  # v_col (mlp=132,): sharded where 132 divides
    "scale": ((128,), ("embed",)),  # not factored: v shaped like the param
}


class _ShardedNet(nn.Module):
    """Logits from the embedding; every other param enters the loss through a cheap penalty
    (each gets a gradient; the shardings checked below depend on the params, not on the net)."""

    @nn.compact
    def __call__(self, tokens):
        init = nn.initializers.normal(0.02)
        p = {
            name: self.param(name, nn.with_logical_partitioning(init, names), shape)
            for name, (shape, names) in SHAPES.items()
        }
        penalty = sum(jnp.mean(jnp.square(v)) for name, v in p.items() if name != "embedding")
        return p["embedding"][tokens] @ p["embedding"].T + penalty


class _ShardedModel:
    def init(self, rng, batch):
        return _ShardedNet().init(rng, jnp.asarray(batch["inputs"]))["params"]

    def loss_fn(self, params, batch, dropout_rng):
        logits = _ShardedNet().apply({"params": params}, batch["inputs"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean(), {}


def _start(trainer):
    """The initial state from given params (random, on the host): the Trainer's fine-tuning
    path; what is checked is where the optimizer state lives, whatever the params' values."""
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: (rng.standard_normal(a.shape) * 0.02).astype(a.dtype), trainer.abstract_state.params
    )
    return trainer.initial_state(params)


def _sharded_batch(step):
    rng = np.random.default_rng([7, step])
    inputs = rng.integers(0, 256, size=(16, 8), dtype=np.int32)
    return {"inputs": inputs, "targets": (inputs * 5 + 1) % 256}


MESHES = {
    # data=2, fsdp=2, model=2 with the FSDP rules: embed -> fsdp, vocab/mlp -> model.
    "2x2x2-fsdp": ({"data": 2, "fsdp": 2, "model": 2}, True),
    # data=1, model=8: embed unsharded; 132 does not divide by 8.
    "1x8": ({"data": 1, "model": 8}, False),
}
# Expected mesh specs (trailing Nones dropped) of Adafactor's factored statistics per mesh.
FACTORED = {
    "2x2x2-fsdp": {
        "embedding": (("fsdp",), ("model",)),
        "wi": (("fsdp",), ("model",)),
        "stack": ((None, "fsdp"), (None, "model")),
        "square": ((), ()),
        "odd": (("fsdp",), ("model",)),
    },
    "1x8": {
        "embedding": ((), ("model",)),
        "wi": ((), ("model",)),
        "stack": ((), (None, "model")),
        "square": ((), ()),
        "odd": ((), ()),
    },
}


def _spec(array):
    spec = tuple(array.sharding.spec)
    while spec and spec[-1] is None:
        spec = spec[:-1]
    return spec


def _find(state, field):
    return [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, field)) if hasattr(s, field)][0]


def _sharded_trainer(model_dir, mesh_name, optimizer):
    axes, fsdp = MESHES[mesh_name]
    partitioner = Partitioner(create_mesh(axes), standard_logical_axis_rules(fsdp=fsdp))
    cfg = TrainerConfig(model_dir=str(model_dir), num_train_steps=2)
    return Trainer(_ShardedModel(), optimizer, 0.01, partitioner, cfg)


def _setup(trainer):
    """`trainer.setup`; returns the texts of the IndivisibleDimensionWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.setup(_sharded_batch(0))
    return [str(w.message) for w in caught if issubclass(w.category, IndivisibleDimensionWarning)]


@pytest.mark.parametrize("optimizer", ["adafactor", "adamw"])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_opt_state_shardings_after_a_step_and_after_restore(tmp_path, mesh_name, optimizer):
    t = _sharded_trainer(tmp_path, mesh_name, OptimizerConfig(name=optimizer))
    # The only indivisible dimension is the param odd's mlp (132) on model=8: one warning,
    # naming the param; its optimizer statistics are replicated without another one.
    messages = _setup(t)
    assert messages == (
        [
            "parameter 'odd': dimension 1 ('mlp', size 132) is not divisible by mesh axes "
            "('model',) of size 8; replicating it"
        ]
        if mesh_name == "1x8"
        else []
    ), messages
    state = _start(t)
    for step in range(2):
        state, _ = t.train_step(state, t.partitioner.shard_batch(_sharded_batch(step)))
    mesh = t.partitioner.mesh
    assert all(leaf.sharding.mesh == mesh for leaf in jax.tree.leaves(state))
    assert _spec(state.params["odd"]) == (("fsdp", "model") if mesh_name == "2x2x2-fsdp" else ())
    if optimizer == "adafactor":
        fs = _find(state, "v_row")
        assert fs.v_row["wi"].shape == (128,) and fs.v_col["wi"].shape == (256,)
        assert fs.v_row["stack"].shape == (2, 128) and fs.v_col["stack"].shape == (2, 256)
        assert fs.v_row["embedding"].shape == (128,) and fs.v_col["embedding"].shape == (256,)
        for name, (row, col) in FACTORED[mesh_name].items():
            assert (_spec(fs.v_row[name]), _spec(fs.v_col[name])) == (row, col), name
            assert fs.v[name].shape == (1,) and _spec(fs.v[name]) == ()
        assert fs.v["scale"].shape == (128,) and fs.v["scale"].sharding == state.params["scale"].sharding
        assert _spec(fs.v_row["scale"]) == _spec(fs.v_col["scale"]) == ()
        assert _spec(fs.count) == ()
    else:
        adam = _find(state, "mu")
        for name in SHAPES:
            assert adam.mu[name].sharding == state.params[name].sharding, name
            assert adam.nu[name].sharding == state.params[name].sharding, name
        assert _spec(adam.count) == ()
    # The public name gives the logical specs behind these shardings.
    logical = opt_state_specs(t.optimizer, t.abstract_state.opt_state, t.abstract_state.params, t.param_specs)
    assert jax.tree.structure(
        logical, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    ) == jax.tree.structure(state.opt_state)

    # A checkpoint restores onto the same shardings (the trainer restores onto abstract_state).
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(2, state)
    ckpt.close()
    fresh = _sharded_trainer(tmp_path / "fresh", mesh_name, OptimizerConfig(name=optimizer))
    _setup(fresh)
    ckpt = Checkpointer(tmp_path / "ckpt")
    try:
        step, restored, _, _ = ckpt.restore(fresh.abstract_state)
    finally:
        ckpt.close()
    assert step == 2
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(state)):
        assert a.sharding == b.sharding, (jax.tree_util.keystr(path), a.sharding, b.sharding)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_logical_adafactor_state_is_sharded_and_restores(tmp_path):
    """factoring="logical": the Trainer builds Adafactor from the params' specs in setup; the
    scanned `stack` keeps per-layer statistics, sharded along the dims they keep."""
    cfg = OptimizerConfig(factoring="logical", freeze=("square",))
    t = _sharded_trainer(tmp_path, "2x2x2-fsdp", cfg)
    assert t.optimizer is None  # built in setup
    _setup(t)
    state = _start(t)
    start = np.asarray(state.params["square"])
    for step in range(2):
        state, _ = t.train_step(state, t.partitioner.shard_batch(_sharded_batch(step)))
    np.testing.assert_array_equal(np.asarray(state.params["square"]), start)
    fs = _find(state, "v_row")
    assert fs.v_row["stack"].shape == (2, 128) and fs.v_col["stack"].shape == (2, 256)
    assert (_spec(fs.v_row["stack"]), _spec(fs.v_col["stack"])) == ((None, "fsdp"), (None, "model"))
    assert (_spec(fs.v_row["wi"]), _spec(fs.v_col["wi"])) == (("fsdp",), ("model",))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(2, state)
    ckpt.close()
    fresh = _sharded_trainer(tmp_path / "fresh", "2x2x2-fsdp", cfg)
    _setup(fresh)
    ckpt = Checkpointer(tmp_path / "ckpt")
    try:
        _, restored, _, _ = ckpt.restore(fresh.abstract_state)
    finally:
        ckpt.close()
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
