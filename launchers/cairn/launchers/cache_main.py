"""`//launchers:cache_tasks`: cache an experiment's training tasks, or registered tasks.

    bazel run //launchers:cache_tasks -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--beam] [--pipeline_options='--runner=DataflowRunner ...'] [--overwrite]
    bazel run //launchers:cache_tasks -- --tasks='my_.*' --module_import=my_tasks \
        --output_dir=/data/cache [--split=train] [--beam] [--pipeline_options=...] [--overwrite]

The one command line for caching (`task_selection`): with `--config`, the experiment's tasks
under `data.cache_dir`, the directory the train entry point reads; with `--tasks`, the tasks a
module registers, under `--output_dir`. In this process by default (small data); with `--beam`
(or `data.cache_with_beam`) through `cairn.datatasks.deterministic.cache_tasks`, Apache Beam's
DirectRunner with 2 worker processes unless `--pipeline_options` names another runner (the
options imply `--beam`). A complete cache is left alone (`--overwrite` rebuilds it); in this
process an incomplete one, or one of an older format, is written again (a local format 3 cache
is upgraded in place); Beam refuses an incomplete one, naming how to clear it. Prints
`<task>: cached | already cached | upgraded` per task. Exit status 2 with one line on a bad
config or flag, a missing or empty task source (`data.SourceError`) or unusable storage.
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from cairn import storage
from cairn.datatasks import DEFAULT_REGISTRY, DataTasksError
from cairn.datatasks.deterministic import cache_task_in_process, cache_tasks, task_dir
from cairn.datatasks.deterministic.cache_job import resolve_tasks
from cairn.datatasks.deterministic.cache_writer import upgrade_in_place
from cairn.datatasks.deterministic.store import is_completed, recache_notice
from cairn.launchers import data as data_lib
from cairn.launchers import entry, task_selection
from cairn.launchers.run_spec import RunSpec

BEAM = flags.DEFINE_bool("beam", False, "Cache with Apache Beam (cache_tasks) instead of in this process.")
PIPELINE_OPTIONS = flags.DEFINE_string("pipeline_options", "", "Beam pipeline options (implies --beam).")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild complete caches too.")
OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "with --tasks: where to write the caches")


def cache(spec: RunSpec, beam: bool = False, pipeline_options: str = "", overwrite: bool = False) -> dict[str, str]:
    """Caches the spec's training tasks; returns `{task: "cached" | "already cached" | "upgraded"}`."""

    config = spec.keys
    with data_lib.source_errors_as_data_errors(config.data.task, config.data.split):  # sources read at registration
        data_lib.register_tasks(config, spec.vocabulary)
    tasks = data_lib.get_tasks(config)
    return cache_into(
        tasks,
        config.data.cache_dir,
        config.data.split,
        list(config.data.task_modules),
        beam,
        pipeline_options,
        overwrite,
    )


def cache_into(
    tasks: Mapping[str, Any],
    cache_dir: str,
    split: str,
    modules: Sequence[str] = (),
    beam: bool = False,
    pipeline_options: str = "",
    overwrite: bool = False,
) -> dict[str, str]:
    """Caches `tasks` (`{name: Task}`) under `cache_dir`: with Beam when `beam` or
    `pipeline_options` (its workers import `modules`, which register the tasks), else here."""
    if beam or pipeline_options:
        with data_lib.source_errors_as_data_errors(", ".join(sorted(tasks)), split):
            return cache_tasks(
                [tasks[name] for name in sorted(tasks)],
                cache_dir,
                split=split,
                module_import=list(modules),
                pipeline_options=shlex.split(pipeline_options) or None,
                overwrite=overwrite,
            )
    done = {}
    for name, task in sorted(tasks.items()):
        path = task_dir(cache_dir, name, split)
        stale = not is_completed(path)
        upgraded = upgrade_in_place(path) if stale and not overwrite else None
        if upgraded:  # a local format 3 cache: its chunk index added, no record rewritten
            print(upgraded, file=sys.stderr, flush=True)
            done[name] = "upgraded"
            continue
        notice = recache_notice(path) if stale and not overwrite else None
        if notice:  # an older format: re-cached, as the train launcher does
            print(notice, file=sys.stderr, flush=True)
        with data_lib.source_errors_as_data_errors(name, split):
            fresh = cache_task_in_process(task, split, path, overwrite=overwrite or stale)
        done[name] = "cached" if fresh else "already cached"
    return done


def _main(spec: RunSpec) -> None:
    result = cache(spec, BEAM.value or spec.keys.data.cache_with_beam, PIPELINE_OPTIONS.value, OVERWRITE.value)
    _print(result, spec.keys.data.cache_dir)


def _main_tasks() -> None:
    output_dir = task_selection.required_dir(OUTPUT_DIR)
    modules = task_selection.import_task_modules()
    tasks = {task.name: task for task in resolve_tasks(task_selection.TASKS.value or "", DEFAULT_REGISTRY)}
    result = cache_into(
        tasks, output_dir, task_selection.SPLIT.value, modules, BEAM.value, PIPELINE_OPTIONS.value, OVERWRITE.value
    )
    _print(result, output_dir)


def _print(result: Mapping[str, str], cache_dir: str) -> None:
    for name, status in sorted(result.items()):
        print(f"{name}: {status} in {cache_dir}", flush=True)


def run() -> None:
    """The program; bad data or unusable storage exit 2."""

    task_selection.run(_main, _main_tasks, expected=(DataTasksError, storage.StorageError))


if __name__ == "__main__":
    entry.main(run)
