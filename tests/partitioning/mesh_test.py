import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from cairn.partitioning import MeshShapeError, create_mesh


@pytest.mark.parametrize("axes,shape", [
    ({"data": 1, "model": 8}, (1, 8)),
    ({"data": 2, "model": 4}, (2, 4)),
    ({"data": 4, "model": 2}, (4, 2)),
    ({"data": 8, "model": 1}, (8, 1)),
    ({"data": 2, "fsdp": 2, "model": 2}, (2, 2, 2)),
])
def test_shapes_and_auto_axes(axes, shape):
    mesh = create_mesh(axes)
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_names == tuple(axes)
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_default_axes_and_minus_one():
    mesh = create_mesh()
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "model": 1}
    assert dict(create_mesh({"data": -1, "model": 2}).shape) == {"data": 4, "model": 2}
    assert dict(create_mesh({"data": 2, "model": -1}, devices=jax.devices()[:4]).shape) == {"data": 2, "model": 2}


def test_shape_not_matching_devices_names_both_numbers():
    with pytest.raises(MeshShapeError, match=r"16 devices but 8 devices"):
        create_mesh({"data": 4, "model": 4})
    with pytest.raises(MeshShapeError, match=r"multiple of 3 .* 8 devices"):
        create_mesh({"data": -1, "model": 3})
    with pytest.raises(MeshShapeError, match="only one mesh axis may be -1"):
        create_mesh({"data": -1, "model": -1})
    with pytest.raises(MeshShapeError, match="positive"):
        create_mesh({"data": 0, "model": 8})


def test_hybrid_mesh_keeps_each_slice_contiguous():
    # Two simulated slices of 4 devices: data spans the slices (DCN), model stays inside (ICI).
    mesh = create_mesh({"data": 4, "model": 2}, num_slices=2)
    slice_of = lambda d: 0 if d.id < 4 else 1  # noqa: E731 - contiguous (process, id) runs
    grid = np.vectorize(slice_of)(mesh.devices)
    np.testing.assert_array_equal(grid, [[0, 0], [0, 0], [1, 1], [1, 1]])
    # DCN on the model axis instead: every model group crosses slices, every data row doesn't.
    mesh = create_mesh({"data": 4, "model": 2}, num_slices=2, dcn_axes={"model": 2})
    grid = np.vectorize(slice_of)(mesh.devices)
    np.testing.assert_array_equal(grid, [[0, 1]] * 4)


def test_hybrid_mesh_errors():
    with pytest.raises(MeshShapeError, match="cannot span 2 slices"):
        create_mesh({"data": 1, "model": 8}, num_slices=2)
    with pytest.raises(MeshShapeError, match="not mesh axes"):
        create_mesh({"data": 8}, num_slices=2, dcn_axes={"replica": 2})
    with pytest.raises(MeshShapeError, match="span 2 slices, but num_slices is 4"):
        create_mesh({"data": 8}, num_slices=4, dcn_axes={"data": 2})
