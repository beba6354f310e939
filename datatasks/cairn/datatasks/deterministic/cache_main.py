"""Command line for `cache_tasks` (argparse; absl flags are not used in datatasks).

  bazel run //datatasks:cache_tasks -- --tasks='my_.*' --output_dir=/data/cache \
      --module_import=my_tasks [--split=train] [--overwrite] \
      [--pipeline_options='--runner=DataflowRunner --project=... --region=...']
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cache_tasks", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="regex over registered task names")
    p.add_argument("--output_dir", required=True)
    p.add_argument(
        "--module_import",
        action="append",
        default=[],
        help="module registering the tasks (repeatable, or comma-separated)",
    )
    p.add_argument("--split", default="train")
    p.add_argument(
        "--pipeline_options",
        action="append",
        default=[],
        help="Beam pipeline flags, shell-quoted; default: DirectRunner, 2 workers",
    )
    p.add_argument("--overwrite", action="store_true", help="rebuild complete caches too")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cwd = os.environ.get("BUILD_WORKING_DIRECTORY")
    output_dir = args.output_dir
    if cwd:
        output_dir = output_dir if "://" in output_dir else os.path.join(cwd, output_dir)
        sys.path.insert(0, cwd)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [cwd] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    modules = [m for arg in args.module_import for m in arg.split(",") if m]
    options = [o for arg in args.pipeline_options for o in shlex.split(arg)]
    from cairn.datatasks.deterministic.cache_job import cache_tasks
    from cairn.datatasks.errors import DataTasksError

    try:
        result = cache_tasks(
            args.tasks,
            output_dir,
            split=args.split,
            module_import=modules,
            pipeline_options=options or None,
            overwrite=args.overwrite,
        )
    except DataTasksError as e:
        print(f"cache_tasks: error: {e}", file=sys.stderr)
        return 2
    for name, status in sorted(result.items()):
        print(f"{name}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
