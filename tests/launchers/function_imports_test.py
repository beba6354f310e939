"""Function-level imports in cairn.launchers only where they keep a heavy import off a light
path (docs/design.md §9): an import statement inside a function of module `F` must load, run
alone in a fresh interpreter, a heavy package below that importing `F` itself does not load
(so the import keeps it off `F`'s import; the test's docstring says how that is measured), or
be listed in `CYCLES` with the reason it cannot be at module level."""

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


# Run in a fresh interpreter: runs argv[2] (the module's import), prints `HEAVY <JSON list>` (the
# heavy packages in sys.modules), then, for each further argument, forks a child that runs it and
# prints the same line; the parent waits for each child (exit 0) before forking the next.
_PROBE = """
import json, os, sys, traceback
heavy = set(json.loads(sys.argv[1]))
def report():
    print("HEAVY", json.dumps(sorted({k.split(".")[0] for k in sys.modules} & heavy)), flush=True)
exec(sys.argv[2], {})
report()
for statement in sys.argv[3:]:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            exec(statement, {})
            report()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"{statement!r} failed (wait status {status})")
"""


def heavy_roots(module: str, statements: list[str]) -> tuple[set[str], list[set[str]]]:
    """The heavy packages that `import cairn.launchers.<module>` loads in a fresh interpreter, and
    those loaded after it and then each of `statements` (each run alone after the module's import:
    in a child forked from that interpreter)."""
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(sorted(HEAVY)), f"import cairn.launchers.{module}", *statements],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [set(json.loads(line[6:])) for line in run.stdout.splitlines() if line.startswith("HEAVY ")]
    assert len(rows) == 1 + len(statements), run.stdout[-2000:]
    return rows[0], rows[1:]


# Run as `python -X importtime -c _TREE HEAVY_JSON PLAN_JSON` (PLAN: `[[module, [statement, ...]],
# ...]`) in a fresh interpreter that imports no heavy package. Per module, a forked child writes
# `MODULE` on stderr, runs `import cairn.launchers.<module>`, prints `HEAVY <JSON list>`, then for
# each statement writes `STATEMENT` on stderr, runs it and prints `DEFINED <JSON list>` (the
# modules that define what it bound); its stdout lines start with the module's name. When the
# child's HEAVY list is empty, the interpreter then imports the module itself (after an `END` on
# stderr, so that its lines are nobody's), and the next children start from there: every child
# starts from a state with no heavy package loaded.
_TREE = """
import json, os, sys, types
heavy = set(json.loads(sys.argv[1]))
def loaded_heavy():
    return sorted({k.split(".")[0] for k in sys.modules} & heavy)
for module, statements in json.loads(sys.argv[2]):
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(2, b"MODULE\\n")
        exec(f"import cairn.launchers.{module}", {})
        base = loaded_heavy()
        print(module, "HEAVY", json.dumps(base), flush=True)
        for statement in statements:
            sys.stderr.flush()
            os.write(2, b"STATEMENT\\n")
            bound = {}
            exec(statement, bound)
            defined = {v.__name__ if isinstance(v, types.ModuleType) else getattr(v, "__module__", None)
                       for k, v in bound.items() if k != "__builtins__"}
            print(module, "DEFINED", json.dumps(sorted(d for d in defined if isinstance(d, str))), flush=True)
        sys.stderr.flush()
        os.write(write, b"light" if not base else b"heavy")
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        light = f.read() == b"light"
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"{module}: wait status {status}")
    os.write(2, b"END\\n")
    if light:
        exec(f"import cairn.launchers.{module}", {})
        assert not loaded_heavy(), module
"""


def first_loads(segment: str) -> list[dict[str, set[str]]]:
    """From one module's `-X importtime` output, per `STATEMENT` marker: each module first loaded
    while that statement ran -> the top-level names of it and of every module first loaded below it."""
    segments = []
    for part in segment.split("STATEMENT\n")[1:]:
        pending: list[tuple[int, set[str]]] = []  # (depth, subtree): post-order, children first
        subtrees: dict[str, set[str]] = {}
        for line in part.splitlines():
            if not line.startswith("import time:") or "imported package" in line:
                continue
            field = line.rsplit("|", 1)[1]
            depth = (len(field) - len(field.lstrip())) // 2
            name = field.strip()
            tree = {name.split(".")[0]}
            while pending and pending[-1][0] > depth:
                tree |= pending.pop()[1]
            subtrees[name] = tree
            pending.append((depth, tree))
        segments.append(subtrees)
    return segments


def targets(statement: str) -> set[str]:
    """The modules an import statement names: each named module, its parents and, for
    `from M import n`, `M.n` (a submodule, if it is one)."""
    node = ast.parse(statement).body[0]
    names = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    )
    return {".".join(n.split(".")[: i + 1]) for n in names for i in range(n.count(".") + 1)}


def sequential(by_module: dict[str, list[str]]) -> dict[str, tuple[set[str], list[str]]]:
    """Per module: `import cairn.launchers.<module>` then its statements, in a child of one fresh
    interpreter (`_TREE`; see the test's docstring): `{module: (its heavy packages, the statements
    not shown to load another)}`."""
    plan = [[module, statements] for module, statements in by_module.items()]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _TREE, json.dumps(sorted(HEAVY)), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    segments = [part.split("END\n")[0] for part in run.stderr.split("MODULE\n")[1:]]
    assert len(segments) == len(plan), run.stderr[-2000:]
    out = {}
    for (module, statements), segment in zip(plan, segments):
        rows = [line.split(" ", 2)[1:] for line in run.stdout.splitlines() if line.startswith(f"{module} ")]
        base_rows = [set(json.loads(v)) for k, v in rows if k == "HEAVY"]
        defined = [set(json.loads(v)) for k, v in rows if k == "DEFINED"]
        loads = first_loads(segment)
        assert len(base_rows) == 1 and len(defined) == len(loads) == len(statements), (module, run.stdout[-2000:])
        out[module] = (base_rows[0], undecided(statements, base_rows[0], loads, defined))
    return out


def undecided(
    statements: list[str], base: set[str], loads: list[dict[str, set[str]]], defined: list[set[str]]
) -> list[str]:
    """The statements not shown (see the test's docstring) to load a heavy package outside
    `base`, from what each first loaded (`loads`) and the modules defining what it bound."""
    loaded_after = {m: tree for part in loads for m, tree in part.items()}

    def justified(i: int) -> bool:
        mine = set(loads[i]) | ((targets(statements[i]) | defined[i]) & set(loaded_after))
        return any((loaded_after[m] & HEAVY) - base for m in mine)

    return [st for i, st in enumerate(statements) if not justified(i)]


def test_every_function_level_import_keeps_a_heavy_import_off_a_light_path():
    """Measured per module `F` in one fresh interpreter (`-X importtime`): `import F` (its heavy
    packages H, exactly), then every function-level import statement of `F` in turn. Importing
    is idempotent and a module not loaded at some point was not loaded after `import F` alone
    either, so a module M first loaded after F's import, with a heavy package P outside H first
    loaded below it, is one whose import after `import F` alone runs the same chain of
    not-yet-loaded modules down to P. A statement is justified (it loads P, which F does not, run
    alone after `import F`) when such an M was first loaded while it ran, or is a module it names
    (`targets`) or one that defines what it bound (`DEFINED`: it had to run for the name to
    exist). The rest (an earlier statement loaded their packages first) are decided exactly by
    `heavy_roots`: one interpreter imports F and forks a child per statement, each starting
    from F's import alone; what F then the statement loads is H plus what the statement loads
    alone in a fresh interpreter. The judgement is that of one fresh interpreter per statement
    and one per module, with each package imported once per module instead of once per
    statement.

    The modules' measurements share one interpreter (`_TREE`): each is a child forked from a
    state where no heavy package is loaded, only the light modules measured before it (their
    imports, none of their statements). Its heavy packages are then exactly those `import F`
    loads in a fresh interpreter (nothing heavy was there before, and whatever F loads it loads
    in either state), and a module first loaded there was not loaded after `import F` alone
    either, so the argument above holds unchanged: only the light imports are shared."""
    imports = function_imports()
    assert imports, "no function-level imports found: has the layout moved?"
    by_module: dict[str, list[str]] = {}
    for name, _, statement in imports:
        if (name, statement) not in CYCLES and statement not in by_module.setdefault(name, []):
            by_module[name].append(statement)
    bad = set()
    measured = sequential({name[:-3]: statements for name, statements in by_module.items() if statements})
    for name, statements in by_module.items():
        if not statements:
            continue
        base, undecided = measured[name[:-3]]
        if undecided:
            base_again, after = heavy_roots(name[:-3], undecided)
            assert base_again == base
            bad |= {(name, st) for st, now in zip(undecided, after) if now <= base}
    pointless = [f"{name}:{line} {statement}" for name, line, statement in imports if (name, statement) in bad]
    assert pointless == [], "imports that keep nothing heavy off their module (move them up): " + "; ".join(pointless)


@pytest.mark.parametrize("key", sorted(CYCLES))
def test_listed_cycles_are_still_function_level(key):
    assert key in {(n, st) for n, _, st in function_imports()}, f"{key} is listed in CYCLES but no longer so"
