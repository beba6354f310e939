"""Modules stay small and single-purpose: no library module is over 400 lines."""

import os

# Under Bazel this file is a runfiles link to the checkout: its real path finds the repository.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
LIMIT = 400


def _modules() -> list:
    out = []
    for lib in LIBRARIES:
        for folder, _, files in os.walk(os.path.join(ROOT, lib, "cairn")):
            out += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return sorted(out)


def test_every_library_module_is_at_most_400_lines():
    modules = _modules()
    assert len(modules) > 100, len(modules)
    long = {}
    for path in modules:
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > LIMIT:
            long[os.path.relpath(path, ROOT)] = n
    assert not long, f"modules over {LIMIT} lines (split them): {long}"
