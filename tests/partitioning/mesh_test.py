import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from cairn.partitioning import MeshShapeError, create_mesh, data_layout
from cairn.partitioning.mesh import _slices


@pytest.mark.parametrize(
    "axes,shape",
    [
        ({"data": 1, "model": 8}, (1, 8)),
        ({"data": 2, "model": 4}, (2, 4)),
        ({"data": 4, "model": 2}, (4, 2)),
        ({"data": 8, "model": 1}, (8, 1)),
        ({"data": 2, "fsdp": 2, "model": 2}, (2, 2, 2)),
    ],
)
def test_shapes_and_auto_axes(axes, shape):
    mesh = create_mesh(axes)
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_names == tuple(axes)
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_default_axes_and_minus_one():
    mesh = create_mesh()
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "expert": 1, "model": 1}
    assert mesh.axis_names == ("data", "fsdp", "expert", "model")  # the batch axes lead
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
    slice_of = lambda d: 0 if d.id < 4 else 1
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


class FakeDevice:
    """Just what `_slices` reads of a device."""

    def __init__(self, id, process_index, slice_index=None):
        self.id, self.process_index = id, process_index
        if slice_index is not None:
            self.slice_index = slice_index


def test_slices_group_by_slice_index_then_process_then_runs():
    # TPU multislice: 2 slices of 2 hosts x 2 chips; slice_index wins over the process.
    tpu = [FakeDevice(i, i // 2, slice_index=i // 4) for i in reversed(range(8))]
    assert [[d.id for d in s] for s in _slices(tpu, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # CPU, 2 processes x 4 devices, 2 slices: one slice per process (ids not contiguous).
    cpu = [FakeDevice(i, 0) for i in (0, 2, 4, 6)] + [FakeDevice(i, 1) for i in (1, 3, 5, 7)]
    assert [[d.id for d in s] for s in _slices(cpu, 2)] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # 4 processes x 2 devices, 2 slices: contiguous runs of hosts (processes 0-1 and 2-3).
    four = [FakeDevice(i, i % 4) for i in range(8)]
    assert [sorted({d.process_index for d in s}) for s in _slices(four, 2)] == [[0, 1], [2, 3]]
    with pytest.raises(MeshShapeError, match="8 devices cannot form 3 equal slices"):
        _slices(tpu, 3)


@pytest.mark.parametrize("dcn_axes,shard_ids", [(None, [0, 1]), ({"model": 2}, [0, 0])], ids=["data-dcn", "model-dcn"])
def test_each_slice_reads_its_own_rows_when_data_spans_slices(dcn_axes, shard_ids):
    """Hosts = slices (devices 0-3 and 4-7). With data across slices the slices hold different
    rows (distinct shard ids); with model across slices they are replica-mates (one shard)."""
    mesh = create_mesh({"data": 4, "model": 2}, num_slices=2, dcn_axes=dcn_axes)
    slice_of = lambda d: 0 if d.id < 4 else 1
    layouts = [data_layout(mesh, "data", process_index=s, process_of=slice_of) for s in (0, 1)]
    assert [lay.shard_id for lay in layouts] == shard_ids
    assert {lay.num_shards for lay in layouts} == {len(set(shard_ids))}
