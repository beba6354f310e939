"""`TrainerConfig.offload_optimizer_state`: the optimizer state lives in host memory
(`memory_kind="pinned_host"`, which CPU devices have too), visits the device inside the step,
trains bit-identically to a run without offload, and checkpoints save and restore it."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig
from cairn.trainer.train_step import check_host_memory


def _trainer(model_dir, steps, offload):
    cfg = TrainerConfig(
        model_dir=str(model_dir),
        num_train_steps=steps,
        checkpoint_every=2,
        tensorboard=False,
        progress=False,
        offload_optimizer_state=offload,
    )
    return Trainer(TinyModel(), OptimizerConfig(name="adamw"), 0.01, make_partitioner(4, 2), cfg)


def _kinds(tree):
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


def test_offloaded_optimizer_state_trains_bit_identically_and_resumes(tmp_path):
    plain = _trainer(tmp_path / "plain", 3, offload=False).train(CountingIterator())
    first = _trainer(tmp_path / "offload", 2, offload=True)
    stopped = first.train(CountingIterator())  # checkpoint at step 2, optimizer state on the host
    assert _kinds(stopped.state.opt_state) == {"pinned_host"} and _kinds(stopped.state.params) == {"device"}
    assert _kinds(first.abstract_state.opt_state) == {"pinned_host"}
    resumed = _trainer(tmp_path / "offload", 3, offload=True).train(CountingIterator())  # restored onto the host
    assert resumed.step == 3 and _kinds(resumed.state.opt_state) == {"pinned_host"}
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), plain.state, resumed.state)
    assert all(jax.tree.leaves(same)), "offloading the optimizer state changed the training"
    assert plain.metrics["loss"] == resumed.metrics["loss"]


def test_offload_needs_pinned_host_memory():
    device = SimpleNamespace(addressable_memories=lambda: [SimpleNamespace(kind="device")])
    partitioner = SimpleNamespace(mesh=SimpleNamespace(local_devices=[device]))
    with pytest.raises(ValueError, match="offload_optimizer_state needs 'pinned_host' memory"):
        check_host_memory(partitioner)


@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerConfig(name="adamw", clip_grad_norm=1e-3, weight_decay=0.1, freeze=("wo",)),
        OptimizerConfig(name="adafactor"),
    ],
    ids=["adamw_clip_freeze", "adafactor"],
)
def test_the_grouped_offload_update_equals_the_whole_update(tmp_path, optimizer):
    """Updating a group of parameters at a time (`offload_group_bytes`: here every leaf alone)
    gives the whole-state update's training within float32 rounding (XLA compiles each group's
    arithmetic in another program, so the last bit may differ), with a global-norm clip that
    clips and a frozen parameter, and the step's program moves the state in one group per leaf,
    in order."""
    from cairn.trainer.offload_update import parameter_groups

    def run(name, group_bytes):
        cfg = TrainerConfig(
            model_dir=str(tmp_path / name),
            num_train_steps=3,
            checkpoint_every=0,
            tensorboard=False,
            progress=False,
            offload_optimizer_state=True,
            offload_group_bytes=group_bytes,
        )
        return Trainer(TinyModel(), optimizer, 0.01, make_partitioner(4, 2), cfg)

    whole, grouped = run("whole", 0), run("grouped", 1)
    a, b = whole.train(CountingIterator()), grouped.train(CountingIterator())
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
    assert _kinds(b.state.opt_state) == {"pinned_host"}
    assert parameter_groups([4, 4, 9, 1], 8) == [[0, 1], [2], [3]]
    hlo = grouped.lower_step().as_text()
    leaves = len(jax.tree.leaves(b.state.params))
    assert hlo.count("optimization_barrier") == leaves - 1  # one move-in per group, in order


def test_offloaded_params_train_bit_identically_on_a_device_copy_and_resume(tmp_path):
    """`offload_params`: float32 master weights in host memory, each step on a device copy
    whose bfloat16-cast kernels arrive as bfloat16 (`cast_only_dtypes`: the MLP's kernels; the
    embedding, used twice, and the float32 scale move as they are), gradients accumulated over
    microbatches, the grouped update bringing each group's params in with its state: the same
    bits as the same run with everything on the device, and a resume restores onto the host."""
    import jax.numpy as jnp

    from cairn.trainer.param_offload import cast_only_dtypes, params_on_device

    model = TinyModel(dtype=jnp.bfloat16)
    batch = CountingIterator().__next__()
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch))
    params = jax.tree.map(lambda x: getattr(x, "value", x), params, is_leaf=lambda x: hasattr(x, "value"))
    dtypes = cast_only_dtypes(lambda p: model.loss_fn(p, batch, jax.random.PRNGKey(1))[0], params)
    assert dtypes == {"embedding": None, "scale": None, "wi": jnp.dtype("bfloat16"), "wo": jnp.dtype("bfloat16")}

    def run(name, steps, offload, group_bytes=0):
        cfg = TrainerConfig(
            model_dir=str(tmp_path / name),
            num_train_steps=steps,
            num_microbatches=2,
            checkpoint_every=2,
            tensorboard=False,
            progress=False,
            offload_optimizer_state=offload,
            offload_params=offload,
            offload_group_bytes=group_bytes,
        )
        trainer = Trainer(
            TinyModel(dtype=jnp.bfloat16), OptimizerConfig(name="adamw"), 0.01, make_partitioner(4, 2), cfg
        )
        return trainer, trainer.train(CountingIterator())

    _, plain = run("plain", 3, offload=False)
    _, stopped = run("offload", 2, offload=True)
    # the kernels' masters in host memory, their bfloat16 copy on the device; the rest stays there
    assert _kinds(stopped.state.opt_state) == {"pinned_host"}
    assert {k: v.sharding.memory_kind for k, v in stopped.state.params.items()} == {
        "embedding": "device",
        "scale": "device",
        "wi": "pinned_host",
        "wo": "pinned_host",
    }
    assert {k: str(v.dtype) for k, v in stopped.state.compute.items() if v is not None} == {
        "wi": "bfloat16",
        "wo": "bfloat16",
    }
    np.testing.assert_array_equal(
        np.asarray(stopped.state.compute["wi"]), np.asarray(stopped.state.params["wi"]).astype(jnp.bfloat16)
    )
    assert _kinds(params_on_device(stopped.state.params)) == {"device"}
    _, resumed = run("offload", 3, offload=True)  # restored onto the host
    assert resumed.step == 3 and _kinds(resumed.state.compute) == {"device"}
    same = jax.tree.map(
        lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), plain.state, resumed.state.replace(compute=None)
    )
    assert all(jax.tree.leaves(same)), "offloading the params changed the training"
    assert plain.metrics["loss"] == resumed.metrics["loss"]
    # a group per leaf: the update's float32 rounding, which a bfloat16 cast of the next step
    # can turn into one bfloat16 step of a weight (2^-8 relative)
    grouped, result = run("grouped", 3, offload=True, group_bytes=1)
    for x, y in zip(jax.tree.leaves(plain.state), jax.tree.leaves(result.state.replace(compute=None))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-3, atol=1e-4)
    hlo = grouped.lower_step().as_text()
    assert "tensor<128x256xbf16>" in hlo and "tensor<32x128xbf16>" not in hlo  # kernels cast, not the embedding
