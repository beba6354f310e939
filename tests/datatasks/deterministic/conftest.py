"""Fixtures: the det_tasks sources and their in-process caches, built once per session."""

import det_tasks
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic import cache_task_in_process, task_dir


@pytest.fixture(scope="session")
def det_env(tmp_path_factory):
    """`(data_dir, cache_dir, registry)` with det_a and det_b cached in-process."""
    root = tmp_path_factory.mktemp("det")
    data_dir, cache_dir = str(root / "data"), str(root / "cache")
    registry = dt.Registry()
    a, b, _ = det_tasks.make(data_dir, registry)
    for task in (a, b):
        cache_task_in_process(task, "train", task_dir(cache_dir, task.name, "train"))
    return data_dir, cache_dir, registry
