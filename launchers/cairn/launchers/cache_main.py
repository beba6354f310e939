"""`//launchers:cache_tasks`: cache the tasks of an experiment's training data.

    bazel run //launchers:cache_tasks -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--beam] [--pipeline_options='--runner=DataflowRunner ...'] [--overwrite]

In this process by default (small data); with `--beam` (or `data.cache_with_beam`) through
`cairn.datatasks.deterministic.cache_tasks`, Apache Beam's DirectRunner unless
`--pipeline_options` names another runner. Writes under `data.cache_dir`, the directory the
train entry point reads. Exit status 2 with one line on a bad config, a missing or empty task
source (`data.SourceError`) or unusable storage.
"""

from __future__ import annotations

import cairn.launchers.startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import shlex
import sys

from absl import flags

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.datatasks.deterministic import cache_task_in_process, cache_tasks, task_dir
from cairn.datatasks.deterministic.cache_writer import upgrade_in_place
from cairn.datatasks.deterministic.store import recache_notice
from cairn.launchers import cli, entry
from cairn.launchers import data as data_lib
from cairn.launchers.run_spec import RunSpec

BEAM = flags.DEFINE_bool("beam", False, "Cache with Apache Beam (cache_tasks) instead of in this process.")
PIPELINE_OPTIONS = flags.DEFINE_string("pipeline_options", "", "Beam pipeline options (implies --beam).")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild complete caches too.")


def cache(spec: RunSpec, beam: bool = False, pipeline_options: str = "", overwrite: bool = False) -> dict[str, str]:
    """Caches the spec's training tasks; returns `{task: "cached" | "already cached"}`."""

    config, reader = spec.keys, spec.reader
    with data_lib.source_errors_as_data_errors(config.data.task, config.data.split):  # sources read at registration
        data_lib.register_tasks(config, spec.vocabulary)
    tasks = data_lib.get_tasks(config)
    if beam or pipeline_options:
        with data_lib.source_errors_as_data_errors(", ".join(sorted(tasks)), config.data.split):
            return cache_tasks(
                list(tasks.values()),
                config.data.cache_dir,
                split=config.data.split,
                module_import=list(config.data.task_modules),
                pipeline_options=shlex.split(pipeline_options) or None,
                overwrite=overwrite,
            )
    done = {}
    for name, task in sorted(tasks.items()):
        path = task_dir(config.data.cache_dir, name, config.data.split)
        stale = name in data_lib.cache_missing(reader, {name: task})
        upgraded = upgrade_in_place(path) if stale and not overwrite else None
        if upgraded:  # a local format 3 cache: its chunk index added, no record rewritten
            print(upgraded, file=sys.stderr, flush=True)
            done[name] = "upgraded"
            continue
        notice = recache_notice(path) if stale and not overwrite else None
        if notice:  # an older format: re-cached, as the train launcher does
            print(notice, file=sys.stderr, flush=True)
        with data_lib.source_errors_as_data_errors(name, config.data.split):
            fresh = cache_task_in_process(task, config.data.split, path, overwrite=overwrite or stale)
        done[name] = "cached" if fresh else "already cached"
    return done


def _main(spec: RunSpec) -> None:
    result = cache(spec, BEAM.value or spec.keys.data.cache_with_beam, PIPELINE_OPTIONS.value, OVERWRITE.value)
    for name, status in sorted(result.items()):
        print(f"{name}: {status} in {spec.keys.data.cache_dir}", flush=True)


def run() -> None:
    """The program; bad data or unusable storage exit 2."""

    cli.run_entry_point(_main, expected=(DataTasksError, storage.StorageError))


if __name__ == "__main__":
    entry.main(run)
