"""models/targets.bzl against the source: every module of cairn.models is in exactly one fine
target, and each target's deps (transitively) cover every `cairn.*` import of its modules, at
module level or inside a function; the one exception is the routed MLP, which `cairn.models.mlp`
imports only for a sparse config and names in its error when it is missing."""

import ast
import pathlib
import sys

import pytest

# Under Bazel the runfiles root (it holds //models:dist); outside, the repository.
ROOT = pathlib.Path(__file__).absolute().parent.parent.parent
PACKAGE = ROOT / "models" / "cairn" / "models"
# Imports a target may leave undeclared: module -> modules it imports only on a path that
# needs the other target too (a sparse config needs //models:moe; cairn.models.mlp says so).
OPTIONAL = {"cairn.models.mlp": {"cairn.models.moe"}}


def load_table(path: pathlib.Path) -> dict:
    """`MODELS_TARGETS` of a targets.bzl file (a dict literal)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODELS_TARGETS":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} defines no MODELS_TARGETS")


def module_name(src: str) -> str:
    """`t5/config.py` -> `cairn.models.t5.config`; `t5/__init__.py` -> `cairn.models.t5`."""
    parts = ["cairn", "models"] + src[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def cairn_imports(path: pathlib.Path, package: pathlib.Path) -> set:
    """The `cairn.*` modules a file imports (`from cairn.models import x`: the submodule `x` when
    there is one, else the package), except under `if TYPE_CHECKING:`."""
    out = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name.startswith("cairn."))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("cairn"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    rel = full.split(".")[2:]
                    is_module = full.startswith("cairn.models.") and (
                        package.joinpath(*rel).is_dir() or package.joinpath(*rel[:-1], rel[-1] + ".py").exists()
                    )
                    out.add(full if is_module or child.module == "cairn" else child.module)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return out


def problems(table: dict, package: pathlib.Path) -> list:
    """What is wrong with `table` for the sources under `package` (empty when nothing is)."""
    bad = []
    owner = {}
    for name, (srcs, deps) in table.items():
        for src in srcs:
            if src in owner:
                bad.append(f"{src} is in both :{owner[src]} and :{name}")
            owner[src] = name
            if not (package / src).exists():
                bad.append(f":{name} lists {src}, which does not exist")
        bad += [f":{name} depends on unknown {d}" for d in deps if d.startswith(":") and d[1:] not in table]
    for path in sorted(package.rglob("*.py")):
        src = path.relative_to(package).as_posix()
        if src not in owner:
            bad.append(f"{src} is in no target of models/targets.bzl")
    module_target = {module_name(src): name for src, name in owner.items()}

    def closure(name: str) -> set:
        seen, todo = set(), [f":{name}"]
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                if dep.startswith(":") and dep[1:] in table:
                    todo += table[dep[1:]][1]
        return seen

    for src, name in sorted(owner.items()):
        if not (package / src).exists():
            continue
        have, me = {d.lstrip(":") if d.startswith(":") else d for d in closure(name)}, module_name(src)
        if "init" not in have:
            bad.append(f":{name} does not include :init (cairn/models/__init__.py)")
        for imported in sorted(cairn_imports(package / src, package) - OPTIONAL.get(me, set())):
            lib = imported.split(".")[1] if "." in imported else ""
            if lib != "models":
                if lib and f"//{lib}" not in have:
                    bad.append(f"{src} imports {imported}: :{name} needs //{lib}")
                continue
            parts = imported.split(".")  # the module and every package above it
            needs = {module_target.get(".".join(parts[:n])) for n in range(2, len(parts) + 1)} - {None}
            bad += [f"{src} imports {imported}: :{name} needs :{need}" for need in sorted(needs - set(have))]
    return bad


@pytest.fixture(scope="module")
def table():
    return load_table(ROOT / "models" / "targets.bzl")


def test_every_module_is_in_one_target_whose_deps_cover_its_imports(table):
    assert problems(table, PACKAGE) == []


def test_the_dense_networks_do_not_depend_on_the_routed_mlp(table):
    """A change to moe.py reruns only what builds a sparse model (docs/testing.md)."""
    for name, (_, deps) in table.items():
        assert ":moe" not in deps, f":{name} depends on :moe"


def test_the_checker_catches_an_undeclared_import(table, tmp_path):
    pkg = tmp_path / "cairn" / "models"
    for src in [s for srcs, _ in table.values() for s in srcs]:
        (pkg / src).parent.mkdir(parents=True, exist_ok=True)
        (pkg / src).write_text("")
    (pkg / "t5" / "network.py").write_text("def f():\n    from cairn.models.llama.rope import x\n")
    (pkg / "layers.py").write_text("from cairn import storage\n")
    (pkg / "new.py").write_text("")
    bad = problems(table, pkg)
    assert "new.py is in no target of models/targets.bzl" in bad
    assert "t5/network.py imports cairn.models.llama.rope: :t5 needs :llama" in bad
    assert "layers.py imports cairn.storage: :core needs //storage" in bad
    assert len(bad) == 3, bad


def test_a_sparse_layer_without_the_routed_mlp_names_the_target(monkeypatch):
    from cairn.models import mlp

    monkeypatch.setitem(sys.modules, "cairn.models.moe", None)
    with pytest.raises(ImportError, match="depend on //models:moe"):
        mlp.routed_mlp()
