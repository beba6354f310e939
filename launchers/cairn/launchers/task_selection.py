"""Which tasks the cache programs work on: an experiment's, or registered ones named by a regex.

`//launchers:cache_tasks` and `//launchers:verify_cache` are the one command line for each of
those jobs. They take either

* `--config=experiment.py[:arg]`: the experiment's training tasks (`data.task`, registered by
  `data.task_modules` with the experiment's vocabulary), under `data.cache_dir`, split
  `data.split`; or
* `--tasks=REGEX --module_import=MODULE [--split=S]` with a directory (`--output_dir` to cache,
  `--cache_dir` to verify): the tasks that Python modules register in `cairn.datatasks`'
  default registry, as seqio's `cache_tasks_main` takes them. No config is read.

Giving both, or neither, is refused (exit 2, one line). `run` dispatches to the program's body for
one or the other.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from absl import flags

from cairn.launchers import cli, entry
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

TASKS = flags.DEFINE_string(
    "tasks", None, "without --config: a regex over registered task names (a mixture's name to verify)"
)
MODULE_IMPORT = flags.DEFINE_multi_string(
    "module_import", [], "without --config: a module that registers the tasks (repeatable, or comma-separated)"
)
SPLIT = flags.DEFINE_string("split", "train", "without --config: the split")


def registered() -> bool:
    """Whether the command names registered tasks (`--tasks`) rather than an experiment."""
    return TASKS.value is not None


def modules() -> list[str]:
    """`--module_import`'s modules, in the order given."""
    return [m for arg in MODULE_IMPORT.value for m in arg.split(",") if m]


def import_task_modules() -> list[str]:
    """Imports `--module_import`'s modules, with the directory the command ran in on the import
    path (and on `PYTHONPATH`, for Beam's worker processes); returns the module names."""
    cwd = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *parts])
    names = modules()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise entry.UsageError(f"--module_import: cannot import {name!r}: {e}") from None
    return names


def required_dir(flag: Any) -> str:
    """The directory a `--tasks` command names with `flag` (resolved as a user path)."""
    if not flag.value:
        raise entry.UsageError(f"--tasks needs --{flag.name}=DIR")
    return entry.user_path(flag.value)


def run(
    on_config: Callable[[RunSpec], int | None],
    on_tasks: Callable[[], int | None],
    expected: tuple[entry.Expected, ...] = (),
    describe: Callable[[BaseException], BaseException | str] | None = None,
) -> None:
    """The program: `on_config(spec)` for `--config`, `on_tasks()` for `--tasks`; a bad
    combination of the two, a config error or an `expected` error is one line, exit status 2."""

    def main() -> int | None:
        logging.getLogger().setLevel(logging.INFO)
        if registered():
            if cli.CONFIG.value is not None:
                raise entry.UsageError("give --config (an experiment's tasks) or --tasks (registered tasks), not both")
            return on_tasks()
        if cli.CONFIG.value is None:
            raise entry.UsageError(
                "--config=path/to/experiment.py[:arg] (an experiment's tasks) or --tasks=REGEX "
                "--module_import=MODULE (registered tasks) is required"
            )
        return on_config(cli.loaded_config())

    entry.run(main, expected=(ConfigError, *expected), flags_parser=cli.parse_flags, describe=describe)
