"""Expert parallelism through the Trainer on 8 CPU devices: a tiny mixture-of-experts Llama
(llama_tiny's shape, 4 experts, top-2, jitter) trained on a data 2 x expert 4 mesh gives the
losses of data parallelism over 8 devices; a checkpoint saved there restores onto data 4 x
expert 2 and training continues as if never interrupted.

Tolerance: losses agree to 1e-5 relative (float32; the sharded dispatch and combine einsums
only reorder sums, measured ~1e-7)."""

import json

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from cairn.models import DecoderOnlyModel, get_preset
from cairn.models.moe_config import MoeConfig
from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig, dropout_key

MOE = MoeConfig(num_experts=4, top_k=2, capacity_factor=1.0, jitter_noise=0.05)
CONFIG = get_preset("llama_tiny", moe=MOE, scan_layers=True)
ROWS, LENGTH, RTOL = 16, 32, 1e-5
# Adafactor factored by logical axis names: the `expert` factor rule, factored statistics
# sharded over the expert axis, and restored onto another expert mesh.
OPTIMIZER = OptimizerConfig(name="adafactor", factoring="logical", min_dim_size_to_factor=32)


class Batches:
    """Deterministic decoder-only batches; the state is the position."""

    def __init__(self):
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng([7, self.position])
        self.position += 1
        tokens = rng.integers(2, CONFIG.vocab_size, size=(ROWS, LENGTH), dtype=np.int32)
        return {
            "decoder_target_tokens": tokens,
            "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
            "decoder_loss_weights": np.ones(tokens.shape, np.float32),
        }

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = state["position"]


def make_trainer(model_dir, data, expert, steps):
    mesh = create_mesh({"data": data, "fsdp": 1, "expert": expert, "model": 1})
    cfg = TrainerConfig(
        model_dir=str(model_dir), num_train_steps=steps, log_every=1, checkpoint_every=0, tensorboard=False
    )
    model = DecoderOnlyModel(CONFIG, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    return Trainer(model, OPTIMIZER, 0.05, Partitioner(mesh, standard_logical_axis_rules()), cfg)


def initial_params(trainer):
    """Random parameters of the model's tree (after `setup`), drawn with numpy like the init
    (kernels normal(0, init_std), norm scales 1): every run starts from them, so no mesh
    compiles the init's random-number program."""
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        if "scale" in jax.tree_util.keystr(path):
            return np.ones(leaf.shape, leaf.dtype)
        return (rng.standard_normal(leaf.shape) * CONFIG.init_std).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, trainer.abstract_state.params)


def train(model_dir, data, expert, steps):
    trainer = make_trainer(model_dir, data, expert, steps)
    trainer.setup(next(Batches()))
    return trainer.train(Batches(), init_params=initial_params(trainer))  # a restore ignores them


def reference_steps(model_dir, steps):
    """Data parallelism over 8 devices: `steps` steps of the partitioned step `train` runs, from
    the state `train` starts from, on the same batches; ({metric: {step: value}}, final params)."""
    trainer, data = make_trainer(model_dir, 8, 1, steps), Batches()
    trainer.setup(next(Batches()))
    state, out = trainer.initial_state(initial_params(trainer)), {}
    for step in range(1, steps + 1):
        state, step_metrics = trainer.train_step(state, trainer.partitioner.shard_batch(next(data)))
        for name, value in step_metrics.items():
            out.setdefault(name, {})[step] = float(value)
    return out, state.params


def metrics(model_dir):
    rows = [json.loads(line) for line in open(model_dir / "summaries" / "metrics.jsonl")]
    out: dict = {}
    for r in rows:
        if r["task"] == "train":
            out.setdefault(r["metric"], {})[r["step"]] = r["value"]
    return out


def test_expert_parallel_losses_equal_data_parallel_and_resume_on_another_expert_mesh(tmp_path, capfd):
    want, reference_params = reference_steps(tmp_path / "data8", steps=4)

    run = tmp_path / "expert"
    first = train(run, data=2, expert=4, steps=2)
    assert "moe balance" in capfd.readouterr().err  # the console's progress line
    wi = first.state.params["layers"]["mlp"]["wi_0"]["kernel"]  # [layers, expert, embed, mlp]
    assert wi.sharding.spec == P(None, "expert", None, "model")  # model: size 1
    resumed = train(run, data=4, expert=2, steps=4)  # restores step 2 onto expert=2
    assert resumed.step == 4
    assert resumed.state.params["layers"]["mlp"]["wi_0"]["kernel"].sharding.mesh.shape["expert"] == 2
    got = metrics(run)

    losses = [want["loss"][s] for s in range(1, 5)]
    assert len(set(losses)) == 4, losses  # training moves: the comparison is not of constants
    np.testing.assert_allclose([got["loss"][s] for s in range(1, 5)], losses, rtol=RTOL)
    # The routing metrics come out of loss_fn, averaged over the routed layers: as many
    # dropped assignments and the same balance whatever the mesh.
    for name in ("moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/aux_loss"):
        assert set(got[name]) == {1, 2, 3, 4}, name
        np.testing.assert_allclose(
            [got[name][s] for s in range(1, 5)], [want[name][s] for s in range(1, 5)], rtol=RTOL, atol=1e-6
        )
    assert all(0 <= want["moe/dropped_fraction"][s] < 1 for s in range(1, 5))
    assert max(want["moe/dropped_fraction"].values()) > 0  # capacity factor 1: some tokens dropped
    final = jax.tree.leaves(jax.device_get(resumed.state.params))
    np.testing.assert_allclose(
        np.concatenate([np.ravel(x) for x in final]),
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(reference_params))]),
        rtol=1e-4,
        atol=1e-6,
    )


def test_routing_metrics_are_means_over_microbatches(tmp_path):
    """Two microbatches give one full batch's routing metrics (means, not sums): routing groups
    are rows, so splitting the batch changes nothing (no jitter here: it draws per microbatch).
    The full batch's metrics are what a one-microbatch step reports: the model's loss_fn on the
    whole batch, from the same state with the step's dropout key."""
    config = CONFIG.replace(moe=MOE.replace(jitter_noise=0.0))
    model = DecoderOnlyModel(config, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    mesh = create_mesh({"data": 2, "fsdp": 1, "expert": 4, "model": 1})
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=1, num_microbatches=2)
    trainer = Trainer(model, OPTIMIZER, 0.05, Partitioner(mesh, standard_logical_axis_rules()), cfg)
    batch = next(Batches())
    trainer.setup(batch)
    state = trainer.initial_state(initial_params(trainer))
    global_batch = trainer.partitioner.shard_batch(batch)
    full_batch = trainer.partitioner.partition(lambda p, b, k: model.loss_fn(p, b, k))
    loss, aux = full_batch(state.params, global_batch, dropout_key(state.rng, state.step))
    full = {"loss": float(loss), **{k: float(v) for k, v in aux.items()}}
    _, step_metrics = trainer.train_step(state, global_batch)
    split = {k: float(v) for k, v in step_metrics.items()}
    for name in ("loss", "moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/aux_loss"):
        np.testing.assert_allclose(split[name], full[name], rtol=RTOL, err_msg=name)
    assert 0 < full["moe/dropped_fraction"] < 1
