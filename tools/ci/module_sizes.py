#!/usr/bin/env python3
"""The largest library modules: a report, not a limit.

Modules are sized by cohesion: a long module that holds one idea is fine, and a short one cut
out of another only to stay under a line count is not (docs/design.md). So nothing here fails;
`.ci/run` prints the largest modules with their line counts and top-level definitions, for a
reviewer to ask of each whether it still holds one idea.

Usage:
    module_sizes.py [--top N]
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")


def module_sizes(root: pathlib.Path = ROOT) -> list[tuple[str, int, int]]:
    """`(path relative to root, lines, top-level functions and classes)` of every library
    module (`<lib>/cairn/**.py`), the longest first (then by path)."""
    out = []
    for lib in LIBRARIES:
        for path in sorted((root / lib / "cairn").rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text, filename=str(path))
            defs = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)
            out.append((str(path.relative_to(root)), len(text.splitlines()), defs))
    return sorted(out, key=lambda r: (-r[1], r[0]))


def report(sizes: list[tuple[str, int, int]], top: int) -> str:
    """A Markdown table of the `top` longest modules, and the count and median of all."""
    lines = ["| module | lines | top-level definitions |", "|---|---|---|"]
    lines += [f"| {path} | {n} | {defs} |" for path, n, defs in sizes[:top]]
    counts = sorted(n for _, n, _ in sizes)
    median = counts[len(counts) // 2] if counts else 0
    lines.append(f"{len(sizes)} modules, median {median} lines")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    print(report(module_sizes(), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
