"""No module-level import cycles between the modules of `*/cairn/**.py`.

The graph is built from the source text with `ast`: an edge for each absolute `cairn.*`
import and each relative import that runs when the module is imported. Imports inside a
function (or lambda) body and inside an `if TYPE_CHECKING:` block do not count; imports
in a class body do. Importing `pkg.sub` adds an edge to `pkg.sub` only, not to the
package `pkg` that Python also initialises (every re-exporting `__init__` would
otherwise be a cycle).

Under Bazel one target per library (`//tests:import_cycles_test_<lib>`) checks the graph of that
library's modules: a cycle through two libraries would need an upward import, which the ladder
forbids (`//tests:layering_test_<lib>`).
"""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")

# The library this target checks (`CAIRN_LIBRARY`, set by tests/BUILD), or all of them.
CHECKED = (os.environ["CAIRN_LIBRARY"],) if os.environ.get("CAIRN_LIBRARY") else LIBRARIES


def _repo_root() -> pathlib.Path:
    # Not resolve(): under Bazel this is the runfiles tree, which holds only declared data.
    return pathlib.Path(__file__).absolute().parent.parent


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every `<lib>/cairn/**.py` of the checked libraries."""
    found: dict[str, pathlib.Path] = {}
    for lib in CHECKED:
        for path in sorted((root / lib / "cairn").rglob("*.py")):
            parts = list(path.relative_to(root / lib).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.AST):
    """The Import/ImportFrom nodes that run at import time."""

    def visit(node: ast.AST):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:  # the `else:` branch does run
                    yield from visit(ast.Module(body=[sub], type_ignores=[]))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from visit(child)

    yield from visit(tree)


def imports_of(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The cairn modules that `name` (at `path`) imports at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        # The longest prefix that is a known module (`cairn.x.y.Name` -> `cairn.x.y`).
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in _module_level_imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cairn":
                    add(alias.name)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module.split(".")[0] != "cairn":
            continue
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            add(sub if sub in known else module)
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative), components as sorted lists, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                result.append(sorted(component))
    return sorted(result)


def _one_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A concrete cycle through the component's first module (for the failure message)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_graph_sees_the_libraries():
    graph = import_graph(_repo_root())
    for lib in CHECKED:
        assert f"cairn.{lib}" in graph
        assert any(edges for name, edges in graph.items() if name.startswith(f"cairn.{lib}.")), lib
    if "datatasks" in CHECKED:
        assert "cairn.datatasks.errors" in graph["cairn.datatasks.mixture"]


def test_detects_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d"]]
    assert _one_cycle(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def test_skips_function_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "x" / "cairn" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from cairn.x import c\n"
    )
    (pkg / "b.py").write_text("def f():\n    from cairn.x import a\n")
    (pkg / "c.py").write_text("from cairn.x.a import thing\n")
    known = {
        "cairn.x": pkg / "__init__.py",
        "cairn.x.a": pkg / "a.py",
        "cairn.x.b": pkg / "b.py",
        "cairn.x.c": pkg / "c.py",
    }
    assert imports_of("cairn.x.a", known["cairn.x.a"], known) == {"cairn.x.b"}
    assert imports_of("cairn.x.b", known["cairn.x.b"], known) == set()
    assert imports_of("cairn.x.c", known["cairn.x.c"], known) == {"cairn.x.a"}


def test_no_import_cycles():
    graph = import_graph(_repo_root())
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    messages = [" -> ".join(_one_cycle(c, graph)) + f"  (component: {', '.join(c)})" for c in cycles]
    assert not messages, "import cycles:\n" + "\n".join(messages)


@pytest.mark.skipif("datatasks" not in CHECKED, reason="//tests:import_cycles_test_datatasks")
def test_registry_does_not_know_its_providers():
    """`registry` stores tasks and mixtures without importing them, even inside a function."""
    path = _repo_root() / "datatasks" / "cairn" / "datatasks" / "registry.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    assert not names & {"cairn.datatasks.mixture", "cairn.datatasks.task"}, names


# The launchers' programs (Bazel binaries and console scripts): each is a root of its own.
ENTRY_POINTS = (
    "cairn.launchers.train_main",
    "cairn.launchers.eval_main",
    "cairn.launchers.infer_main",
    "cairn.launchers.cache_main",
    "cairn.launchers.verify_cache_main",
    "cairn.launchers.export",
    "cairn.launchers.peft_export_main",
    "cairn.launchers.verify",
    "cairn.launchers.jobset",
    "cairn.launchers.plot_loss",
)


def _all_imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The cairn modules `name` imports anywhere (function bodies included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for target in names:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@pytest.mark.skipif("launchers" not in CHECKED, reason="//tests:import_cycles_test_launchers")
def test_no_entry_point_imports_another():
    """No program imports another's module, directly or through others, even inside a
    function: the start-up they share lives in `run_setup`."""
    known = modules(_repo_root())
    assert set(ENTRY_POINTS) <= set(known), sorted(set(ENTRY_POINTS) - set(known))
    edges = {name: _all_imports(name, path, known) for name, path in known.items()}
    found = []
    for entry in ENTRY_POINTS:
        seen, todo = set(), [entry]
        while todo:
            for child in edges[todo.pop()] - seen:
                seen.add(child)
                todo.append(child)
        found += [f"{entry} -> {other}" for other in sorted(seen & set(ENTRY_POINTS) - {entry})]
    assert not found, found


@pytest.mark.skipif("trainer" not in CHECKED, reason="//tests:import_cycles_test_trainer")
def test_the_training_loop_does_not_know_the_trainer():
    """`Trainer` builds the `TrainLoop` and hands it a `StepProgram`; the loop module imports no
    trainer module, even for type checking (the dependency runs one way)."""
    known = modules(_repo_root())
    loop = "cairn.trainer.loop"
    assert "cairn.trainer.trainer" not in _all_imports(loop, known[loop], known)
    assert loop in _all_imports("cairn.trainer.trainer", known["cairn.trainer.trainer"], known)
