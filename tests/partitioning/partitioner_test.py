"""The Partitioner on the issue's meshes: same numbers as one device, shardings as the rules say."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules

EMBED, MLP, BATCH, LENGTH = 16, 32, 8, 4


# -- a sharded matmul-and-reduce ----------------------------------------------------------


def matmul_reduce(constrain, x, w):
    y = constrain(jnp.tanh(x @ w), ("batch", "mlp"))
    return y, y.sum(axis=0), y.sum()


def test_matmul_and_reduce_equals_one_device(partitioner, assert_sharding):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * 2, EMBED * 2), dtype=np.float32)
    w = rng.standard_normal((EMBED * 2, MLP * 2), dtype=np.float32)
    want = jax.jit(functools.partial(matmul_reduce, lambda a, _: a))(x, w)

    specs = (("batch", "embed"), ("embed", "mlp"))
    in_sh = partitioner.shardings_for(specs, (x, w))
    out_sh = partitioner.shardings_for((("batch", "mlp"), ("mlp",), ()))
    fn = partitioner.partition(
        functools.partial(matmul_reduce, partitioner.with_sharding_constraint), in_shardings=in_sh, out_shardings=out_sh
    )
    xs, ws = jax.device_put(x, in_sh[0]), jax.device_put(w, in_sh[1])
    assert_sharding(xs, partitioner, ("batch", "embed"))
    assert_sharding(ws, partitioner, ("embed", "mlp"))
    got = fn(xs, ws)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5)
    assert_sharding(got[0], partitioner, ("batch", "mlp"))
    assert_sharding(got[1], partitioner, ("mlp",))
    assert got[2].sharding.is_fully_replicated


def test_with_sharding_constraint_sets_the_layout_gspmd_keeps(partitioner, assert_sharding):
    x = jnp.arange(BATCH * MLP, dtype=jnp.float32).reshape(BATCH, MLP)
    fn = partitioner.partition(lambda a: partitioner.with_sharding_constraint(a * 2, ("batch", "mlp")))
    y = fn(x)
    assert_sharding(y, partitioner, ("batch", "mlp"))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2)
    assert "sharding" in fn.lower(x).as_text()  # .lower runs under the mesh too


def test_shard_batch_single_host(partitioner, assert_sharding):
    layout = partitioner.data_layout()
    assert (layout.shard_id, layout.num_shards) == (0, 1)
    rows = np.arange(BATCH * LENGTH, dtype=np.int32).reshape(BATCH, LENGTH)
    (out,) = partitioner.shard_batch((rows,), ("batch", "length"))
    assert out.shape == rows.shape
    np.testing.assert_array_equal(np.asarray(out), rows)
    assert_sharding(out, partitioner, ("batch", "length"))


def test_indivisible_parameter_is_replicated_with_warning_or_refused():
    mesh = create_mesh({"data": 1, "model": 8})
    specs = {"dec": {"wi": ("embed", "mlp")}}
    shapes = {"dec": {"wi": jax.ShapeDtypeStruct((16, 12), jnp.float32)}}
    with pytest.warns(UserWarning, match=r"dec/wi.*size 12"):
        sh = Partitioner(mesh, standard_logical_axis_rules()).shardings_for(specs, shapes)
    assert sh["dec"]["wi"].spec == P(None, None)
    with pytest.raises(ValueError, match=r"dec/wi"):
        Partitioner(mesh, standard_logical_axis_rules(), on_indivisible="error").shardings_for(specs, shapes)


def test_unknown_logical_axis_names_the_tree_path():
    partitioner = Partitioner(create_mesh({"data": 4, "model": 2}), standard_logical_axis_rules())
    specs = {"encoder": {"layers_0": {"attention": {"query": ("embed", "head")}}}}
    with pytest.raises(ValueError, match=r"'encoder/layers_0/attention/query': logical axis 'head'"):
        partitioner.shardings_for(specs)


def test_functions_trace_with_their_partitioner_active():
    from cairn.partitioning import current_partitioner

    mesh = create_mesh({"data": 2, "fsdp": 1, "expert": 4, "model": 1})
    partitioner = Partitioner(mesh, standard_logical_axis_rules())
    seen = []

    def fn(x):
        seen.append(current_partitioner())
        # [expert, batch, capacity, embed]: expert axis on dim 0, data on dim 1; a batch of
        # 3 divides by nothing and is left unsharded without a warning.
        return partitioner.constrain(x * 2, ("expert", "batch", None, "embed")), current_partitioner().constrain(
            jnp.ones((3, 4)), ("batch", "embed")
        )

    x = jnp.ones((4, 2, 3, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, z = partitioner.partition(fn)(x)
    assert seen == [partitioner] and current_partitioner() is None
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("expert", "data", None, None)), 4), y.sharding
    assert z.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(y), 2 * np.ones((4, 2, 3, 5)))
    # Off: activations are left to GSPMD.
    off = Partitioner(mesh, standard_logical_axis_rules(), constrain_activations=False)
    assert off.constrain(x, ("expert", "batch", None, "embed")) is x


def test_batch_over_data_and_expert():
    partitioner = Partitioner(
        create_mesh({"data": 2, "fsdp": 1, "expert": 4, "model": 1}), standard_logical_axis_rules()
    )
    assert partitioner.batch_parts() == 8
    (out,) = partitioner.shard_batch((np.arange(16 * 2).reshape(16, 2),))
    assert out.sharding.spec == P(("data", "expert"), None)
    assert partitioner.data_layout().num_shards == 1  # one host feeds every row
