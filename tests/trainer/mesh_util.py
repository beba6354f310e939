"""Partitioners over the 8 virtual CPU devices, for the trainer tests."""

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules


def make_partitioner(data: int, model: int) -> Partitioner:
    """A `data` x `model` mesh with the standard logical-axis rules."""
    return Partitioner(create_mesh({"data": data, "model": model}), standard_logical_axis_rules())
