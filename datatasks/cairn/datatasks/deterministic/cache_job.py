"""`cache_tasks`: the Apache Beam job that caches tasks for the deterministic reader.

One Beam element per (task, source shard): a worker runs the shard through the task's
cacheable preprocessors and writes one ArrayRecord shard (`cache_writer.write_shard`);
the driver then merges the summaries and writes `COMPLETED` (`cache_writer.finalize`).
Each shard's records are shuffled once by a permutation seeded with the shard index and the
task's fingerprint, so record `i` is the same bytes on every run and runner.
Apache Beam is imported only inside the functions here (docs/design.md §1).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

from cairn.datatasks import url_sources
from cairn.datatasks.deterministic import cache_writer
from cairn.datatasks.deterministic.store import task_dir
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.registry import DEFAULT_REGISTRY, Registry

DEFAULT_PIPELINE_OPTIONS = ("--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing")


def import_modules(modules: Sequence[str]) -> None:
    for m in modules:
        importlib.import_module(m)


def resolve_tasks(tasks: str | Sequence[Any], registry: Registry) -> list[Any]:
    """Tasks from a regex over registered task names, or a list of names / `Task`s."""
    if isinstance(tasks, str):
        pattern = re.compile(tasks)
        names = [n for n in registry.task_names() if pattern.fullmatch(n)]
        if not names:
            raise DataTasksError(
                f"--tasks={tasks!r} matches no registered task; registered: "
                f"{registry.task_names()} (did you pass --module_import?)"
            )
        return [registry.get_task(n) for n in names]
    return [registry.get_task(t) if isinstance(t, str) else t for t in tasks]


class _WriteShard:
    """The per-element work, as a picklable callable the Beam `DoFn` wraps."""

    def __init__(self, modules: Sequence[str], tasks: dict[str, Any]):
        self.modules = tuple(modules)
        self.tasks = tasks
        self._ready = False

    def __call__(self, item: tuple) -> dict:
        name, split, index, count, path = item
        if not self._ready:
            import_modules(self.modules)
            self._ready = True
        task = DEFAULT_REGISTRY.get_task(name) if name in DEFAULT_REGISTRY else self.tasks[name]
        return cache_writer.write_shard(task, split, index, count, path)


def cache_tasks(
    tasks: str | Sequence[Any],
    output_dir: str,
    split: str = "train",
    module_import: Sequence[str] = (),
    pipeline_options: Sequence[str] | None = None,
    overwrite: bool = False,
    registry: Registry | None = None,
) -> dict[str, str]:
    """Caches `tasks` (a regex over registered names, or names / `Task`s) under `output_dir`.

    Args:
      module_import: modules that register the tasks; imported here and on every worker.
      pipeline_options: Beam flags, passed through unchanged; default: DirectRunner with 2
        worker processes.
      overwrite: rebuild complete caches too (otherwise they are left as they are).
    Returns:
      `{task name: "cached" | "already cached"}`.
    Raises:
      DataTasksError: on an incomplete cache (unless `overwrite`), naming how to clear it.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    import_modules(module_import)
    todo = resolve_tasks(tasks, registry or DEFAULT_REGISTRY)
    result: dict[str, str] = {}
    items, pending = [], []
    for task in todo:
        path = task_dir(output_dir, task.name, split)
        if not cache_writer.prepare(path, overwrite):
            result[task.name] = "already cached"
            continue
        count = cache_writer.num_source_shards(task, split)
        items += [(task.name, split, i, count, path) for i in range(count)]
        pending.append((task, path, count))
    try:
        if items:
            options = PipelineOptions(list(pipeline_options if pipeline_options else DEFAULT_PIPELINE_OPTIONS))
            fn = _WriteShard(module_import, {t.name: t for t, _, _ in pending})
            with beam.Pipeline(options=options) as p:
                _ = p | "Shards" >> beam.Create(items) | "Spread" >> beam.Reshuffle() | "WriteShard" >> beam.Map(fn)
        for task, path, count in pending:
            cache_writer.finalize(task, split, path, count)
            result[task.name] = "cached"
    except BaseException as e:
        for _, path, _ in pending:  # no unfinished cache is left behind (complete ones stay)
            cache_writer.discard(path)
        worker = worker_error(e)
        if worker is not None:
            raise worker from None
        raise
    return result


# The last line of a worker's traceback that Beam's runners put in their own error's message:
# `cairn.datatasks.<module>.<Name>Error: <message>[ while running '<step>']`.
_WORKER_ERROR = re.compile(r"^cairn\.datatasks\.[\w.]+\.(\w+Error): (.*?)(?: \[while running '[^']*'\])?$", re.M)


_STEP = re.compile(r" \[while running '[^']*'\]$")


def worker_error(error: BaseException) -> DataTasksError | None:
    """The `DataTasksError` a Beam worker raised (a bad source file, a changed source), rebuilt
    from the error Beam raises for it in the driver (its message holds the worker's traceback),
    so that it reads as one line as in-process; None when `error` holds none. (An in-memory
    runner raises the worker's own error, its message followed by the step: that is cut.)"""
    if isinstance(error, DataTasksError):
        message = _STEP.sub("", str(error))
        return type(error)(message) if message != str(error) else None
    found = _WORKER_ERROR.findall(str(error))
    if not found:
        return None
    name, message = found[-1]
    return url_sources.CorruptSourceError(message) if name == "CorruptSourceError" else DataTasksError(message)
