"""Deterministic pipelines (docs/design.md §3.2): the cache job and the reader of global batches.

cache_tasks("my_task", "/data/cache", module_import=["my_tasks"])   # Apache Beam
reader = DeterministicReader("my_task", "/data/cache", seed=0, global_batch_size=256,
                             sequence_length={"inputs": 512, "targets": 128},
                             feature_converter=EncDecFeatureConverter(pack=True),
                             host_index=jax.process_index(), host_count=jax.process_count())
batch = next(reader); state = reader.get_state(); reader.set_state(state)
verify_cache("/data/cache", "my_task")   # {task: [problems]}: re-hashes every byte
"""

from cairn.datatasks.deterministic.cache_job import cache_tasks
from cairn.datatasks.deterministic.cache_writer import cache_task_in_process
from cairn.datatasks.deterministic.cached_task import CachedTask
from cairn.datatasks.deterministic.fingerprint import task_fingerprint
from cairn.datatasks.deterministic.permutation import Permutation
from cairn.datatasks.deterministic.reader import DeterministicReader
from cairn.datatasks.deterministic.store import (
    CacheFormatError,
    CacheIntegrityError,
    CacheMismatchError,
    cache_state,
    task_dir,
)
from cairn.datatasks.deterministic.verify import verify_cache

__all__ = [
    "CacheFormatError",
    "CacheIntegrityError",
    "CacheMismatchError",
    "CachedTask",
    "DeterministicReader",
    "Permutation",
    "cache_state",
    "cache_task_in_process",
    "cache_tasks",
    "task_dir",
    "task_fingerprint",
    "verify_cache",
]
