"""Console scripts of `pip install cairn-launchers` (launchers/pyproject.toml, `[project.scripts]`).

Each script runs the same `run()` as its Bazel target and `python -m cairn.launchers.<module>`:

| script | Bazel target | module |
|---|---|---|
| `cairn-train` | `//launchers:train` | `train_main` |
| `cairn-eval` | `//launchers:eval` | `eval_main` |
| `cairn-infer` | `//launchers:infer` | `infer_main` |
| `cairn-cache-tasks` | `//launchers:cache_tasks` | `cache_main` |
| `cairn-verify` | `//launchers:verify` | `verify` |
| `cairn-verify-cache` | `//launchers:verify_cache` | `verify_cache_main` |
| `cairn-export` | `//launchers:export` | `export` |
| `cairn-export-peft` | `//launchers:export_peft` | `peft_export_main` |
| `cairn-jobset` | `//launchers:jobset` | `jobset` |
| `cairn-plot-loss` | `//launchers:plot_loss` | `plot_loss` |

absl's `--help` prints the docstring of `__main__` and the flags key to `sys.argv[0]`; for a
console script both belong to pip's generated wrapper, so `_run` hands them over from the
program's module first (`cairn-train --help` then reads as `python -m ... --help` does).
"""

from __future__ import annotations

import importlib
import sys

from absl import flags

from cairn.launchers import entry


def _run(module_name: str) -> None:
    module = importlib.import_module(f"cairn.launchers.{module_name}")
    main = sys.modules.get("__main__")
    if main is not None and main is not module:
        main.__doc__ = module.__doc__
        for flag in flags.FLAGS.get_key_flags_for_module(module.__name__):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    entry.main(module.run, own_process=True)  # the process ends there, as under `python -m`


def train() -> None:
    """`cairn-train`: `cairn.launchers.train_main.run()`."""
    _run("train_main")


def evaluate() -> None:
    """`cairn-eval`: `cairn.launchers.eval_main.run()`."""
    _run("eval_main")


def infer() -> None:
    """`cairn-infer`: `cairn.launchers.infer_main.run()`."""
    _run("infer_main")


def cache_tasks() -> None:
    """`cairn-cache-tasks`: `cairn.launchers.cache_main.run()`."""
    _run("cache_main")


def verify() -> None:
    """`cairn-verify`: `cairn.launchers.verify.run()`."""
    _run("verify")


def verify_cache() -> None:
    """`cairn-verify-cache`: `cairn.launchers.verify_cache_main.run()`."""
    _run("verify_cache_main")


def export() -> None:
    """`cairn-export`: `cairn.launchers.export.run()`."""
    _run("export")


def export_peft() -> None:
    """`cairn-export-peft`: `cairn.launchers.peft_export_main.run()`."""
    _run("peft_export_main")


def jobset() -> None:
    """`cairn-jobset`: `cairn.launchers.jobset.run()`."""
    _run("jobset")


def plot_loss() -> None:
    """`cairn-plot-loss`: `cairn.launchers.plot_loss.run()`."""
    _run("plot_loss")
