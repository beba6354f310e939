"""The factored-RMS gate: Adafactor's CPU variant (`lax.rsqrt`, a row mean as a product) only on
CPU, `optax.scale_by_factored_rms` on GPU/TPU; forced either way here, on CPU.

Tolerances: the two variants' updates from one state agree to 2e-6 relative per element (float32
rounding of `rsqrt` against `** -0.5` and of a mean computed as a product; measured <= 6e-7);
their new states agree bitwise except `v_col` of matrices whose row mean goes through the
product (same 2e-6). The state structures are identical, so a checkpoint written with one
variant resumes with the other.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import Trainer, TrainerConfig, adafactor_t5, optimizers

RTOL = 2e-6


def _params():
    rng = np.random.default_rng(0)  # numpy draws: no random-number program to compile
    shapes = {
        "wide": (128, 512),
        "tall": (256, 128),
        "heads": (128, 6, 8),
        "small": (64, 32),
        "bias": (64,),
        "three": (3, 130, 200),
    }
    return {k: jnp.asarray(rng.standard_normal(s, np.float32) * 0.05) for k, s in shapes.items()}


def _grads(params, i):
    rng = np.random.default_rng([1, i])
    return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape, np.float32)), params)


def test_auto_follows_the_backend_and_switch_forces_either(monkeypatch):
    assert jax.default_backend() == "cpu"
    assert optimizers.factored_rms_variant() == "cpu"
    assert optimizers.factored_rms_variant("optax") == "optax"
    monkeypatch.setattr(optimizers, "FACTORED_RMS", "optax")
    assert optimizers.factored_rms_variant() == "optax"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert optimizers.factored_rms_variant("auto") == "optax"
    with pytest.raises(ValueError, match="'auto', 'cpu', 'optax'"):
        optimizers.factored_rms_variant("fast")


def test_optax_variant_is_optax_adafactor_bitwise():
    params = _params()
    ours, ref = adafactor_t5(0.01, factored_rms="optax"), optax.adafactor(0.01, eps=1e-30, decay_rate=0.8)
    a, b = jax.jit(ours.init)(params), jax.jit(ref.init)(params)
    for i in range(3):
        ua, a = jax.jit(ours.update)(_grads(params, i), a, params)
        ub, b = jax.jit(ref.update)(_grads(params, i), b, params)
        jax.tree.map(np.testing.assert_array_equal, ua, ub)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_cpu_and_optax_variants_agree_and_share_the_state():
    params = _params()
    cpu, ref = adafactor_t5(0.01, factored_rms="cpu"), adafactor_t5(0.01, factored_rms="optax")
    state, ref_state = jax.jit(cpu.init)(params), jax.jit(ref.init)(params)
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    jax.tree.map(np.testing.assert_array_equal, state, ref_state)
    for i in range(4):  # from one state each step: the state of either variant feeds the other
        u_cpu, s_cpu = jax.jit(cpu.update)(_grads(params, i), state, params)
        u_ref, s_ref = jax.jit(ref.update)(_grads(params, i), state, params)
        assert jax.tree.structure(s_cpu) == jax.tree.structure(s_ref)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=0), u_cpu, u_ref)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=0), s_cpu, s_ref)
        factored = [x for x in jax.tree.leaves(s_cpu, is_leaf=lambda x: hasattr(x, "v_row")) if hasattr(x, "v_row")]
        other = [x for x in jax.tree.leaves(s_ref, is_leaf=lambda x: hasattr(x, "v_row")) if hasattr(x, "v_row")]
        for a, b in zip(factored, other):
            jax.tree.map(np.testing.assert_array_equal, (a.count, a.v_row, a.v), (b.count, b.v_row, b.v))
        state = s_cpu if i % 2 else s_ref


@pytest.mark.parametrize("first,second", [("cpu", "optax"), ("optax", "cpu")])
def test_a_checkpoint_of_one_variant_resumes_with_the_other(tmp_path, first, second):
    def train(model_dir, variant, steps):
        cfg = TrainerConfig(model_dir=str(model_dir), num_train_steps=steps, tensorboard=False, log_every=1)
        tx = adafactor_t5(0.01, factored_rms=variant)
        return Trainer(TinyModel(), tx, 0.01, make_partitioner(4, 2), cfg).train(CountingIterator())

    assert train(tmp_path / "mixed", first, 2).step == 2
    mixed = train(tmp_path / "mixed", second, 4)
    straight = train(tmp_path / "straight", second, 4)
    assert mixed.step == straight.step == 4
    assert jax.tree.structure(mixed.state) == jax.tree.structure(straight.state)
    # Two steps of the other variant's rounding, carried through two more steps.
    for a, b in zip(jax.tree.leaves(mixed.state.params), jax.tree.leaves(straight.state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert mixed.metrics["loss"] == pytest.approx(straight.metrics["loss"], rel=1e-5)
