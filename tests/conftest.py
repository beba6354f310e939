"""Fixtures shared by the repository-level tests (layering, packaging)."""

import ast
import pathlib
import shutil
import sys

import pytest

LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")


def _repo_root() -> pathlib.Path:
    # Not resolve(): under Bazel this is the runfiles tree, which holds only declared data.
    return pathlib.Path(__file__).absolute().parent.parent


def scan_imports(path: pathlib.Path):
    """Yields (top-level module, dotted name, line, lazy) for each absolute import in a file.

    `lazy` is True for imports inside a function body (they run only when called).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name.split(".")[0], alias.name, child.lineno, lazy
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module == "cairn":
                for alias in child.names:  # `from cairn import storage` imports cairn.storage
                    yield "cairn", f"cairn.{alias.name}", child.lineno, lazy
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module.split(".")[0], child.module, child.lineno, lazy
            yield from visit(child, inner)

    yield from visit(tree, False)


def library_sources(root: pathlib.Path, lib: str):
    return sorted((root / lib / "cairn" / lib).rglob("*.py"))


def third_party(module: str) -> bool:
    return module not in sys.stdlib_module_names and module not in ("cairn", "__future__")


def copy_library(root: pathlib.Path, lib: str, dest: pathlib.Path) -> pathlib.Path:
    """A copy of `<root>/<lib>` at `dest` (dereferencing Bazel's symlinks, so that building writes
    nowhere in the tree), with a stand-in README.md when the checkout's is not there: the library's
    `:dist` leaves its documents out (only the docs checks read them), and the README is only the
    wheel's long description."""
    shutil.copytree(root / lib, dest, symlinks=False, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    if not (dest / "README.md").exists():
        (dest / "README.md").write_text(f"# cairn-{lib}\n", encoding="utf-8")
    return dest


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return _repo_root()


class _Scanner:
    """The helpers above, handed to tests as the `imports` fixture."""

    libraries = LIBRARIES
    scan_imports = staticmethod(scan_imports)
    library_sources = staticmethod(library_sources)
    third_party = staticmethod(third_party)
    copy_library = staticmethod(copy_library)


@pytest.fixture(scope="session")
def imports() -> _Scanner:
    return _Scanner()
