"""Command line for `verify_cache`: re-hash a task cache and its sources, name what differs.

  python -m cairn.datatasks.deterministic.verify_main --cache_dir=/data/cache \
      --tasks='my_.*' --module_import=my_tasks [--split=train] [--verbose]

Prints `<task>/<split>: ok` per task whose cache matches, or one line per problem
(`<task>/<split>: <file or part>: <what differs>`). Exit status 0 when everything matches,
2 otherwise (also on an error such as an unknown task; a traceback only with --verbose).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="verify_cache", description=__doc__.splitlines()[0])
    p.add_argument("--cache_dir", required=True, help="the output_dir that cache_tasks wrote")
    p.add_argument("--tasks", required=True, help="a registered task or mixture name, or a regex over task names")
    p.add_argument(
        "--module_import",
        action="append",
        default=[],
        help="module registering the tasks (repeatable, or comma-separated)",
    )
    p.add_argument("--split", default="train")
    p.add_argument("--verbose", action="store_true", help="print a traceback on an error")
    return p.parse_args(list(argv))


def report(results: dict[str, list[str]], split: str, out=None) -> int:
    """Prints `results` (`verify_cache`'s) one line per problem; returns the exit status."""
    out = out or sys.stdout
    bad = 0
    for name, problems in sorted(results.items()):
        if not problems:
            print(f"{name}/{split}: ok", file=out)
        for line in problems:
            print(f"{name}/{split}: {line}", file=out)
        bad += len(problems)
    return 2 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cwd = os.environ.get("BUILD_WORKING_DIRECTORY")
    cache_dir = args.cache_dir
    if cwd:
        cache_dir = cache_dir if "://" in cache_dir else os.path.join(cwd, cache_dir)
        sys.path.insert(0, cwd)
    try:
        from cairn.datatasks.deterministic.cache_job import import_modules
        from cairn.datatasks.deterministic.verify import verify_cache

        import_modules([m for arg in args.module_import for m in arg.split(",") if m])
        results = verify_cache(cache_dir, args.tasks, split=args.split)
    except Exception as e:
        if args.verbose:
            traceback.print_exc()
        print(f"verify_cache: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return report(results, args.split)


if __name__ == "__main__":
    sys.exit(main())
