"""`//launchers:cache_tasks`: cache the tasks of an experiment's training data.

    bazel run //launchers:cache_tasks -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--beam] [--pipeline_options='--runner=DataflowRunner ...'] [--overwrite]

In this process by default (small data); with `--beam` (or `data.cache_with_beam`) through
`cairn.datatasks.deterministic.cache_tasks`, Apache Beam's DirectRunner unless
`--pipeline_options` names another runner. Writes under `data.cache_dir`, the directory the
train entry point reads. Exit status 2 on a bad config.
"""

from __future__ import annotations

import shlex
import sys

from absl import flags

from cairn.launchers import cli, validation
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError

BEAM = flags.DEFINE_bool("beam", False, "Cache with Apache Beam (cache_tasks) instead of in this process.")
PIPELINE_OPTIONS = flags.DEFINE_string("pipeline_options", "", "Beam pipeline options (implies --beam).")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild complete caches too.")


def cache(config, beam: bool = False, pipeline_options: str = "", overwrite: bool = False) -> dict[str, str]:
    """Caches the config's training tasks; returns `{task: "cached" | "already cached"}`."""
    from cairn.datatasks.deterministic import cache_task_in_process, cache_tasks, task_dir

    validation.check_schema(config)
    validation.check_paths(config)
    vocabulary = data_lib.make_vocabulary(config)
    data_lib.register_tasks(config, vocabulary)
    tasks = data_lib.get_tasks(config)
    if beam or pipeline_options:
        return cache_tasks(list(tasks.values()), config.data.cache_dir, split=config.data.split,
                           module_import=list(config.data.task_modules),
                           pipeline_options=shlex.split(pipeline_options) or None, overwrite=overwrite)
    done = {}
    for name, task in sorted(tasks.items()):
        path = task_dir(config.data.cache_dir, name, config.data.split)
        stale = name in data_lib.cache_missing(config, {name: task})
        done[name] = "cached" if cache_task_in_process(task, config.data.split, path,
                                                       overwrite=overwrite or stale) else "already cached"
    return done


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.fail(ConfigError("config", f"unexpected arguments {argv[1:]}"))
    try:
        config = cli.loaded_config()
        result = cache(config, BEAM.value or config.data.cache_with_beam, PIPELINE_OPTIONS.value, OVERWRITE.value)
    except ConfigError as e:
        cli.fail(e)
    except Exception as e:
        from cairn import storage
        from cairn.datatasks import DataTasksError

        if isinstance(e, (DataTasksError, storage.StorageError)):
            cli.fail(e)
        raise
    for name, status in sorted(result.items()):
        print(f"{name}: {status} in {config.data.cache_dir}", flush=True)
    sys.exit(0)


def run() -> None:
    from absl import app

    app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    run()
