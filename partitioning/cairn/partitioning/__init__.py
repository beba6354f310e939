"""cairn.partitioning: Device meshes and logical-axis sharding for data, FSDP, expert and model parallelism.

Imports only JAX and NumPy.
"""

__version__ = "0.1.0"

from cairn.partitioning.consistency import (
    GatheredDigests,
    ReplicaBatchMismatchError,
    check_replica_batches,
    gather_row_digests,
    row_digests,
)
from cairn.partitioning.data_layout import DataLayout, data_layout
from cairn.partitioning.distributed import DistributedConfig, initialize_distributed, resolve_distributed
from cairn.partitioning.memory import MemoryEstimate, estimate_memory, transformer_activations
from cairn.partitioning.mesh import DATA, DEFAULT_AXES, EXPERT, FSDP, MODEL, MeshShapeError, create_mesh
from cairn.partitioning.opt_state import opt_state_logical_specs
from cairn.partitioning.partitioner import Partitioner, current_partitioner
from cairn.partitioning.peer_watchdog import PEER_LOST_EXIT_CODE, PeerWatchdog, await_lost_peer, start_peer_watchdog
from cairn.partitioning.rules import (
    OPTIONAL_AXES,
    IndivisibleDimensionError,
    IndivisibleDimensionWarning,
    LogicalAxisRules,
    UnknownLogicalAxisError,
    logical_to_mesh_spec,
    rules_for_mesh,
    standard_logical_axis_rules,
)

__all__ = [
    "DATA",
    "DEFAULT_AXES",
    "DataLayout",
    "EXPERT",
    "DistributedConfig",
    "FSDP",
    "GatheredDigests",
    "IndivisibleDimensionError",
    "IndivisibleDimensionWarning",
    "LogicalAxisRules",
    "MODEL",
    "MemoryEstimate",
    "MeshShapeError",
    "OPTIONAL_AXES",
    "PEER_LOST_EXIT_CODE",
    "Partitioner",
    "PeerWatchdog",
    "ReplicaBatchMismatchError",
    "UnknownLogicalAxisError",
    "await_lost_peer",
    "check_replica_batches",
    "create_mesh",
    "current_partitioner",
    "data_layout",
    "estimate_memory",
    "gather_row_digests",
    "initialize_distributed",
    "logical_to_mesh_spec",
    "opt_state_logical_specs",
    "resolve_distributed",
    "row_digests",
    "rules_for_mesh",
    "standard_logical_axis_rules",
    "start_peer_watchdog",
    "transformer_activations",
]
