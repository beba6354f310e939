import pytest

from cairn.partitioning import DataLayout, create_mesh, data_layout


def layouts(mesh, batch_axes, hosts=2):
    """Layouts of `hosts` simulated hosts owning contiguous runs of device ids."""
    per = 8 // hosts
    return [data_layout(mesh, batch_axes, h, process_of=lambda d: d.id // per) for h in range(hosts)]


def test_one_host_reads_everything():
    mesh = create_mesh({"data": 4, "model": 2})
    assert data_layout(mesh, "data") == DataLayout(0, 1)


@pytest.mark.parametrize(
    "axes,batch_axes,want",
    [
        ({"data": 8, "model": 1}, "data", [(0, 2), (1, 2)]),  # pure data parallel: each host its half
        ({"data": 2, "model": 4}, "data", [(0, 2), (1, 2)]),  # one replica per host
        ({"data": 1, "model": 8}, "data", [(0, 1), (0, 1)]),  # one replica spans both: same shard
        ({"data": 2, "fsdp": 2, "model": 2}, ("data", "fsdp"), [(0, 2), (1, 2)]),
    ],
)
def test_two_hosts(axes, batch_axes, want):
    got = [(l.shard_id, l.num_shards) for l in layouts(create_mesh(axes), batch_axes)]
    assert got == want


def test_hosts_sharing_a_replica_read_the_same_shard():
    # 4 hosts, 2 replicas of 4 devices: hosts 0,1 hold replica 0 and hosts 2,3 replica 1.
    got = [(l.shard_id, l.num_shards) for l in layouts(create_mesh({"data": 2, "model": 4}), "data", hosts=4)]
    assert got == [(0, 2), (0, 2), (1, 2), (1, 2)]


def test_rows():
    layout = DataLayout(1, 4)
    assert layout.host_batch_size(32) == 8
    assert layout.host_rows(32) == slice(8, 16)
    with pytest.raises(ValueError, match="30 is not divisible by the 4 data shards"):
        layout.host_batch_size(30)


def test_interleaved_hosts_are_refused():
    mesh = create_mesh({"data": 8, "model": 1})
    with pytest.raises(ValueError, match="non-contiguous"):
        data_layout(mesh, "data", 0, process_of=lambda d: d.id % 2)
