"""cairn.datatasks: Task-based data pipelines: sources, preprocessors, feature converters, packing, deterministic pipelines."""

__version__ = "0.1.0"
