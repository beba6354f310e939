"""Shared fixtures for the partitioning tests: the meshes of the issue on 8 CPU devices."""

import jax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules

#: (data, model) meshes, one data x fsdp x model mesh (with the FSDP rules) and one
#: data x fsdp x expert x model mesh (the batch over data x expert).
MESH_SHAPES = [(1, 8), (2, 4), (4, 2), (8, 1), (2, 2, 2), (2, 1, 4, 1)]


def make_partitioner(shape, **kwargs) -> Partitioner:
    if len(shape) == 2:
        mesh = create_mesh({"data": shape[0], "model": shape[1]})
        rules = standard_logical_axis_rules()
    elif len(shape) == 3:
        mesh = create_mesh({"data": shape[0], "fsdp": shape[1], "model": shape[2]})
        rules = standard_logical_axis_rules(fsdp=True)
    else:
        mesh = create_mesh(dict(zip(("data", "fsdp", "expert", "model"), shape)))
        rules = standard_logical_axis_rules()
    return Partitioner(mesh, rules, **kwargs)


@pytest.fixture(scope="session", autouse=True)
def eight_devices():
    assert jax.device_count() == 8, "run through tools/testing/pytest_main.py (8 CPU devices)"


@pytest.fixture(params=MESH_SHAPES, ids=lambda s: "x".join(map(str, s)))
def partitioner(request) -> Partitioner:
    return make_partitioner(request.param)


def expected_spec(partitioner, logical):
    """What the standard rules ask for, written out by hand for these meshes."""
    fsdp = "fsdp" in partitioner.mesh.shape and "expert" not in partitioner.mesh.shape
    table = {
        "batch": ("data", "fsdp") if fsdp else (("data", "expert") if "expert" in partitioner.mesh.shape else "data"),
        "embed": "fsdp" if fsdp else None,
        "mlp": "model",
        "vocab": "model",
        "length": None,
        None: None,
    }
    out = [table[name] for name in logical]
    if logical[0] == "batch":  # activations: fsdp already taken by batch
        out = [out[0]] + [None if a == "fsdp" else a for a in out[1:]]
    return P(*out)


def assert_sharding(array, partitioner, logical):
    want = NamedSharding(partitioner.mesh, expected_spec(partitioner, logical))
    assert array.sharding.is_equivalent_to(want, array.ndim), (logical, array.sharding.spec, want.spec)


@pytest.fixture(name="assert_sharding")
def assert_sharding_fixture():
    """`assert_sharding(array, partitioner, logical_names)`: the array has the rules' sharding."""
    return assert_sharding
