"""Which rows of the global batch each host reads."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """This host's shard of the global batch.

    Hosts whose devices hold the same rows (the same data-parallel replica) get the same
    `shard_id` and must feed the same data. Rows of shard `k` are the `k`-th contiguous block
    of `global_batch_size // num_shards` rows.
    """

    shard_id: int
    num_shards: int

    def host_batch_size(self, global_batch_size: int) -> int:
        """Rows this host feeds per step."""
        if global_batch_size % self.num_shards:
            raise ValueError(
                f"global batch size {global_batch_size} is not divisible by the {self.num_shards} data shards"
            )
        return global_batch_size // self.num_shards

    def host_rows(self, global_batch_size: int) -> slice:
        """The rows of the global batch this host feeds."""
        size = self.host_batch_size(global_batch_size)
        return slice(self.shard_id * size, (self.shard_id + 1) * size)


def data_layout(
    mesh: Mesh, batch_axes, process_index: int | None = None, process_of: Callable = lambda d: d.process_index
) -> DataLayout:
    """The `DataLayout` of `process_index` (default: this process) for a batch whose first
    dimension is split over the mesh axes `batch_axes` (a name, a tuple of names, or None).

    Derived from the sharding (`devices_indices_map`), not from device ids, which are not
    contiguous across processes. `process_of` maps a device to its host (tests simulate
    hosts with it).
    """
    if process_index is None:
        process_index = jax.process_index()
    axes = () if batch_axes is None else ((batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes))
    parts = math.prod(mesh.shape[a] for a in axes)
    sharding = NamedSharding(mesh, PartitionSpec(axes if axes else None))
    rows: dict = {}
    for device, index in sharding.devices_indices_map((parts,)).items():
        start = index[0].start or 0
        rows.setdefault(process_of(device), set()).add(start)
    blocks = {}
    for process, starts in rows.items():
        starts = sorted(starts)
        if starts != list(range(starts[0], starts[0] + len(starts))):
            raise ValueError(
                f"host {process} holds non-contiguous batch rows {starts} of {parts}; order the mesh devices by host"
            )
        blocks[process] = (starts[0], len(starts))
    sizes = {n for _, n in blocks.values()}
    if len(sizes) != 1:
        raise ValueError(f"hosts hold different numbers of batch shards: {blocks}")
    distinct = sorted(set(blocks.values()))
    if process_index not in blocks:
        raise ValueError(f"process {process_index} holds no device of the mesh")
    return DataLayout(shard_id=distinct.index(blocks[process_index]), num_shards=len(distinct))
