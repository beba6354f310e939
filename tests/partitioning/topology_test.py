"""`cairn.partitioning.topology` and `platform.compile_target`: TPU slices this host does not have,
described by libtpu for ahead-of-time compiles (no TPU needed), and the platform programs are
built for."""

import jax
import jax.numpy as jnp
import pytest

from cairn.partitioning import create_mesh, platform, topology


def test_topology_names_parse_and_bad_ones_name_the_forms():
    spec = topology.parse_topology("v5e:2x4")
    assert (spec.generation, spec.shape, spec.chips, spec.name) == ("v5e", (2, 4), 8, "v5e:2x4")
    assert spec.host_bounds() == (2, 4, 1)  # v5litepod-8: one host
    assert topology.parse_topology("v5e:4x4").host_bounds() == (2, 2, 1)  # four hosts of 2x2
    assert topology.parse_topology("v4:2x2x2").host_bounds() == (2, 2, 1)
    for bad, words in [
        ("v5e", "is not GENERATION:AxB[xC]"),
        ("v9:2x2", "is not GENERATION:AxB[xC]"),
        ("v5e:2x2x1", "v5e slices have 2 axes of chips, e.g. v5e:2x4"),
        ("v4:2x2", "v4 slices have 3 axes of chips, e.g. v4:2x2x1"),
        ("v5e:3x4", "whole hosts of 2x2 chips"),
        ("v5e:0x1", "2 axes of chips"),
    ]:
        with pytest.raises(topology.TopologyError, match=words.replace("[", r"\[").replace("]", r"\]")):
            topology.parse_topology(bad)


def test_cloud_accelerator_types_name_their_default_slices():
    """The `--accelerator_type` of `gcloud` (and launchers/pod/tpu.sh): v4 and v5p count two
    TensorCores per chip, v5e and v6e count chips."""
    assert topology.accelerator_topology("v5litepod-16") == "v5e:4x4"
    assert topology.accelerator_topology("v5litepod-8") == "v5e:2x4"
    assert topology.accelerator_topology("v6e-64") == "v6e:8x8"
    assert topology.accelerator_topology("v4-32") == "v4:2x2x4"
    assert topology.accelerator_topology("v5p-8") == "v5p:2x2x1"
    assert topology.accelerator_topology("v5e:2x4") is None  # already a topology
    assert topology.parse_topology("v4-8").name == "v4:2x2x1"
    with pytest.raises(topology.TopologyError, match=r"accelerator type 'v4-6' is not a slice this knows: v4-8, "):
        topology.parse_topology("v4-6")
    pod = topology.topology_devices("v5litepod-16")
    assert len(pod) == 16 and topology.process_count(pod) == 4


def test_described_devices_have_their_kind_hosts_and_memory():
    one = topology.topology_devices("v5e:1x1")
    assert len(one) == 1 and one[0].platform == "tpu" and one[0].device_kind == "TPU v5 lite"
    assert topology.hbm_bytes(one[0]) == int(15.75 * 2**30)  # the chip's bytes_limit, measured
    pod = topology.topology_devices("v5e:4x4")
    assert len(pod) == 16 and topology.process_count(pod) == 4
    v4 = topology.topology_devices("v4:2x2x1")
    assert v4[0].device_kind == "TPU v4" and topology.hbm_bytes(v4[0]) > topology.hbm_bytes(one[0])
    assert topology.hbm_bytes(jax.devices()[0]) is None  # a CPU device: no table entry


def test_compile_target_is_what_backend_says_inside_and_nests():
    assert platform.backend() == "cpu"
    with platform.compile_target("tpu"):
        assert platform.backend() == "tpu"
        assert platform.platform_variant("auto", ("auto", "cpu", "x"), "v", "x") == "x"
        with platform.compile_target("gpu"):
            assert platform.backend() == "gpu"
        assert platform.backend() == "tpu"
    assert platform.backend() == "cpu"
    with pytest.raises(ValueError, match="compile target must be one of"):
        with platform.compile_target("tpuv5"):
            pass
    with platform.for_devices(jax.devices()):  # this host's devices: nothing changes
        assert platform.backend() == "cpu"
    with platform.for_devices(topology.topology_devices("v5e:1x1")):
        assert platform.backend() == "tpu"


def test_a_program_compiles_for_a_described_slice_with_its_memory():
    """XLA:TPU compiles a sharded program for 8 described chips: per-chip memory of a quarter
    of the [4096, 1024] float32 operand each (data axis 4 x model axis 2 over 8 chips)."""
    devices = topology.topology_devices("v5e:2x4")
    mesh = create_mesh({"data": 4, "model": 2}, devices=devices)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", "model"))
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32, sharding=sharding)
    with platform.for_devices(devices):
        compiled = jax.jit(lambda a: jnp.tanh(a) * 2.0).lower(x).compile()
    memory = compiled.memory_analysis()
    assert memory.argument_size_in_bytes == 4096 * 1024 * 4 // 8
    assert ":T(8,128)" in compiled.as_text()  # XLA:TPU's tiled layouts (no CPU compile has them)


def test_without_the_compiler_the_error_names_the_install(monkeypatch):
    monkeypatch.setattr(topology, "compiler_path", lambda: None)
    with pytest.raises(
        topology.TopologyError,
        match=r"needs XLA:TPU's compiler: pip install --no-deps --target .*tpu-compiler libtpu==0.0.42.1",
    ):
        topology.topology_devices("v5e:1x1")


def test_the_compiler_is_found_beside_site_packages_and_not_imported():
    import importlib.util
    import os

    path = topology.compiler_path()
    assert path is not None and os.path.isfile(path) and path.endswith("libtpu.so")
    assert importlib.util.find_spec("libtpu") is None  # not importable: JAX does not open a TPU at start-up


def test_a_multi_host_slices_mesh_keeps_each_hosts_rows_one_block():
    """On v5e 4x4 (4 hosts of 2x2 chips) JAX's physical ring order interleaves hosts along a
    16-device data axis; the mesh falls back to host order, so each host feeds one block of rows
    (else `data_layout` refuses: a pod run would stop at start-up). One host's slice keeps the
    physical order."""
    from jax.experimental import mesh_utils

    from cairn.partitioning import data_layout

    pod = topology.topology_devices("v5e:4x4")
    physical = mesh_utils.create_device_mesh((16,), pod, allow_split_physical_axes=True)
    assert [d.process_index for d in physical.flat] != sorted(d.process_index for d in pod)  # interleaved
    mesh = create_mesh({"data": -1}, devices=pod)
    layouts = [data_layout(mesh, ("data",), host) for host in range(4)]
    assert sorted(x.shard_id for x in layouts) == [0, 1, 2, 3] and {x.num_shards for x in layouts} == {4}
    model_parallel = create_mesh({"data": 4, "model": 4}, devices=pod)
    for row in model_parallel.devices:  # each model group is one host's four chips
        assert len({d.process_index for d in row}) == 1
    one_host = topology.topology_devices("v5e:2x4")
    kept = create_mesh({"data": -1}, devices=one_host)
    assert list(kept.devices.flat) == list(mesh_utils.create_device_mesh((8,), one_host).flat)
