"""cairn.partitioning: Device meshes and logical-axis sharding for data, FSDP and model parallelism."""

__version__ = "0.1.0"
