"""`//launchers:verify_cache`: the full check of task caches, an experiment's or registered ones.

    bazel run //launchers:verify_cache -- \
        --config=launchers/configs/shakespeare_t5_tiny.py [--verbose]
    bazel run //launchers:verify_cache -- --cache_dir=/data/cache --tasks='my_.*' \
        --module_import=my_tasks [--split=train] [--verbose]

The one command line for verifying a cache (`task_selection`): with `--config`, the experiment's
training tasks under `data.cache_dir`; with `--tasks` (a regex over registered task names, or a
mixture's name), the tasks a module registers, under `--cache_dir`. Re-hashes every shard against
the checksums the cache writer recorded, and fingerprints the source files again
(`cairn.datatasks.deterministic.verify_cache`; training start-up reads metadata only). Prints
`<task>/<split>: ok`, or one line per problem naming the shard or source file. Exit status 0
when everything matches, 2 otherwise (also on a bad config or flag; a traceback only with
--verbose).
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

from absl import flags

from cairn.datatasks.deterministic import verify_cache
from cairn.datatasks.deterministic.verify import report
from cairn.launchers import data as data_lib
from cairn.launchers import entry, task_selection
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

CACHE_DIR = flags.DEFINE_string("cache_dir", None, "with --tasks: the directory the caches were written to")


def verify(spec: RunSpec) -> dict[str, list[str]]:
    """`{task: [problem, ...]}` for the spec's training tasks (all empty: all match)."""

    data_lib.register_tasks(spec.keys, spec.vocabulary)
    tasks = data_lib.get_tasks(spec.keys)
    return verify_cache(spec.reader.cache_dir, list(tasks.values()), split=spec.reader.split)


def _main(spec: RunSpec) -> int:

    return report(verify(spec), spec.reader.split)


def _main_tasks() -> int:
    cache_dir = task_selection.required_dir(CACHE_DIR)
    task_selection.import_task_modules()
    split = task_selection.SPLIT.value
    return report(verify_cache(cache_dir, task_selection.TASKS.value or "", split=split), split)


def _describe(error: BaseException) -> BaseException:
    return (
        error
        if isinstance(error, (ConfigError, entry.UsageError))
        else RuntimeError(f"{type(error).__name__}: {error}")
    )


def run() -> None:
    """The program: any failure to read a cache is one line, exit 2 (a traceback with --verbose)."""
    task_selection.run(_main, _main_tasks, expected=(Exception,), describe=_describe)


if __name__ == "__main__":
    entry.main(run)
