"""Each library builds as its own wheel, declares what it imports, and installs alone.

Under Bazel one target per library (`//tests:packaging_test_<lib>`) checks that library only."""

import email.parser
import functools
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import venv
import zipfile

import pytest


def _build_wheels(repo_root: pathlib.Path, libs: list, out: pathlib.Path, copy_library) -> dict:
    """`pip wheel` of the libraries in one pip process; `{lib: wheel}`."""
    srcs = [str(copy_library(repo_root, lib, out / f"src-{lib}")) for lib in libs]
    wheels = out / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(wheels),
            *srcs,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = {}
    for lib in libs:
        (found[lib],) = wheels.glob(f"cairn_{lib}-*.whl")
    return found


def _requirements(wheel: pathlib.Path) -> set:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(z.read(meta).decode())
    names = set()
    for req in message.get_all("Requires-Dist") or []:
        names.add(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _under_test(libraries: tuple) -> tuple:
    """The library this target checks (`CAIRN_LIBRARY`, set by tests/BUILD's per-library targets),
    or every library (outside Bazel)."""
    lib = os.environ.get("CAIRN_LIBRARY")
    return (lib,) if lib else libraries


@functools.cache
def _packages_distributions() -> dict:
    """importlib.metadata.packages_distributions(), read once: it reads every installed
    distribution's file list (about a second per call)."""
    return importlib.metadata.packages_distributions()


def _distributions_of(module: str) -> set:
    dists = _packages_distributions().get(module, [])
    return {d.lower().replace("_", "-") for d in dists}


@pytest.fixture(scope="module")
def wheels(repo_root, imports, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    return _build_wheels(repo_root, list(_under_test(imports.libraries)), out, imports.copy_library)


def test_wheels_hold_their_library_and_no_namespace_init(wheels, imports):
    for lib, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
        assert f"cairn/{lib}/__init__.py" in names
        assert "cairn/__init__.py" not in names
        others = {n.split("/")[1] for n in names if n.startswith("cairn/")}
        assert others == {lib}, f"{wheel.name} carries {others - {lib}}"


def test_declared_dependencies_cover_imports(wheels, imports, repo_root):
    for lib, wheel in wheels.items():
        declared = _requirements(wheel)
        missing = set()
        for path in imports.library_sources(repo_root, lib):
            for top, name, _, _ in imports.scan_imports(path):
                if top == "cairn":
                    other = name.split(".")[1]
                    if other != lib and f"cairn-{other}" not in declared:
                        missing.add(f"cairn-{other}")
                elif imports.third_party(top):
                    dists = _distributions_of(top)
                    assert dists, f"{lib} imports {top}, which no installed distribution provides"
                    if not dists & declared:
                        missing.add(f"{top} ({'/'.join(sorted(dists))})")
        assert not missing, f"cairn-{lib} imports but does not declare: {sorted(missing)}"


def test_version_matches_pyproject_and_wheel(wheels, repo_root):
    for lib, wheel in wheels.items():
        init = (repo_root / lib / "cairn" / lib / "__init__.py").read_text()
        version = re.search(r'__version__ = "([^"]+)"', init).group(1)
        assert wheel.name.startswith(f"cairn_{lib}-{version}-")


@pytest.mark.skipif("tokenizers" not in _under_test(("tokenizers",)), reason="//tests:packaging_test_tokenizers")
def test_tokenizers_installs_and_imports_alone(wheels, tmp_path):
    """`pip install ./tokenizers` in a clean venv: it imports with no other cairn library.

    The venv borrows third-party packages from this interpreter's site-packages through a
    .pth file (tests download nothing), but cairn libraries come only from the wheel.
    """
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True, capture_output=True, text=True
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    pathlib.Path(site, "borrowed.pth").write_text("\n".join(ours) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheels["tokenizers"]),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code = (
        "import importlib.util, sys\n"
        "import cairn.tokenizers as t\n"
        "assert t.__file__.startswith(sys.prefix), t.__file__\n"
        "assert importlib.util.find_spec('cairn.datatasks') is None\n"
        "v = t.ByteVocabulary()\n"
        "assert v.decode(v.encode('cairn')) == 'cairn'\n"
        "import importlib.metadata as m\n"
        "print(m.version('cairn-tokenizers'), t.__version__)\n"
    )
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path, env=clean_env, timeout=120
    )
    installed, attribute = out.stdout.split()
    assert installed == attribute == "0.1.0"
