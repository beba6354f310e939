"""cairn.launchers: Entry points (train, eval, infer, cache_tasks) and one ml-collections config per experiment."""

__version__ = "0.1.0"
