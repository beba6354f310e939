"""Function-level imports in cairn.launchers only where they keep a heavy import off a light
path (docs/design.md §9): an import statement inside a function of module `F` must load, run
alone in a fresh interpreter, a heavy package below that importing `F` itself does not load
(so the import keeps it off `F`'s import), or be listed in `CYCLES` with the reason it cannot
be at module level."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHERS = ROOT / "launchers" / "cairn" / "launchers"
HEAVY = {
    "jax",
    "jaxlib",
    "tensorflow",
    "flax",
    "optax",
    "orbax",
    "matplotlib",
    "apache_beam",
    "safetensors",
    "torch",
    "transformers",
    "tensorstore",
    "wandb",
}
# (module file, import statement): why the import stays inside a function.
CYCLES: dict[tuple[str, str], str] = {
    ("config_base.py", "from cairn.launchers.validation import ConfigError"): "validation imports config_base",
}


def function_imports() -> list[tuple[str, int, str]]:
    """(file, line, import statement) of every absolute import inside a function body."""
    found = []
    for path in sorted(LAUNCHERS.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
                    found.append((path.name, node.lineno, ast.unparse(node)))
    return sorted(set(found))


def heavy_roots(statement: str) -> list[str]:
    """The heavy packages that running `statement` (an import) loads in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "exec(sys.argv[1])\n"
        "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules} & set(json.loads(sys.argv[2])))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, statement, json.dumps(sorted(HEAVY))], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_function_level_import_keeps_a_heavy_import_off_a_light_path():
    imports = function_imports()
    assert imports, "no function-level imports found: has the layout moved?"
    cache: dict[str, set[str]] = {}

    def roots(statement: str) -> set[str]:
        if statement not in cache:
            cache[statement] = set(heavy_roots(statement))
        return cache[statement]

    pointless = [
        f"{name}:{line} {statement}"
        for name, line, statement in imports
        if (name, statement) not in CYCLES and roots(statement) <= roots(f"import cairn.launchers.{name[:-3]}")
    ]
    assert pointless == [], "imports that keep nothing heavy off their module (move them up): " + "; ".join(pointless)


@pytest.mark.parametrize("key", sorted(CYCLES))
def test_listed_cycles_are_still_function_level(key):
    assert key in {(n, st) for n, _, st in function_imports()}, f"{key} is listed in CYCLES but no longer so"
