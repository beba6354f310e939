"""The Partitioner on the issue's meshes: same numbers as one device, shardings as the rules say."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
