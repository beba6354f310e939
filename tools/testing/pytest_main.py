"""Runs pytest on the module of the current Bazel test target (`$CAIRN_TEST_MODULE`, which
`cairn_py_test` sets, comma-separated modules for `cairn_py_test_group`; else `//pkg:name` ->
pkg/name.py).

Outside Bazel, pass the test files as arguments. Every test sees 8 virtual CPU devices
unless XLA_FLAGS says otherwise (docs/design.md §10), and starts with the tests' XLA and
TensorFlow settings (`process_log/sitecustomize.py`; `CAIRN_TEST_FAST=0` for their own).
"""

import os
import sys
import time

_START = time.monotonic()  # the target's wall time, written into its test.xml (tools/ci/test_times.py)

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _test_site():
    """`process_log/sitecustomize.py`, the start of every process a test starts, as a module."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_log", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("cairn_test_site", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The tests' start-up settings, for this process and (through the sitecustomize) every one it starts.
os.environ.setdefault("CAIRN_TEST_FAST", "1")
_test_site().apply_test_speedups(os.environ)
if os.environ.get("TEST_TMPDIR"):  # under Bazel the home may be read-only: caches go to the test's tmp
    os.environ.setdefault("CAIRN_CACHE_HOME", os.path.join(os.environ["TEST_TMPDIR"], "cairn-cache"))


def _jax_compilation_cache() -> None:
    """A JAX persistent compilation cache, inherited by the processes the test starts, so that a
    program compiled once is loaded after that (results are bit-identical: the same executable).

    Under `./bazelw test` every target shares one cache (`CAIRN_TEST_JAX_CACHE`, a folder that
    ./bazelw creates under .cache/ and lets the sandbox write): the many training runs of the
    suite compile each of their programs once. Entries are written under JAX's file lock (it
    takes one when a maximum size is set), so targets running side by side never read a half-written
    entry. Without it (plain `bazel test`), one cache per target in its TEST_TMPDIR; outside
    Bazel, a temporary folder removed at exit. Only programs that took >= 0.1 s to compile are
    written."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    shared = os.environ.get("CAIRN_TEST_JAX_CACHE")
    if shared and os.path.isdir(shared) and os.access(shared, os.W_OK):
        path = shared
        os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(64 << 30))
    elif os.environ.get("TEST_TMPDIR"):
        path = os.path.join(os.environ["TEST_TMPDIR"], "jax-compilation-cache")
    else:
        import atexit
        import shutil
        import tempfile

        path = tempfile.mkdtemp(prefix="cairn-test-jax-cache-")
        atexit.register(shutil.rmtree, path, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")


_jax_compilation_cache()

# Processes this test starts that run one of these are training runs (tools/ci/test_times.py).
TRAIN_MARKERS = ("cairn.launchers.train_main", "train_worker.py", "cairn-train")


def _process_log() -> str:
    """Every Python process this test starts appends its command line to this log
    (`process_log/sitecustomize.py`, put on the children's PYTHONPATH here)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_log")
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        path = os.path.join(tmp, "cairn-test-processes.jsonl")
    else:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="cairn-test-processes-", suffix=".jsonl")
        os.close(fd)
    os.environ["CAIRN_TEST_PROCESS_LOG"] = path
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([folder] + ([old] if old else []))
    sys.path.insert(0, folder)  # for tests that pass their own sys.path on to a child
    return path


def _count_processes(path: str) -> tuple:
    """(Python processes started, of which training runs, of which imported TensorFlow) from the
    process log (TensorFlow: those that exited normally, the only ones that say)."""
    import json

    started = train = tf = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    if record.get("exit"):
                        tf += bool(record.get("tensorflow"))
                        continue
                    argv = " ".join(record["argv"])
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                started += 1
                train += any(m in argv for m in TRAIN_MARKERS)
    except OSError:
        pass
    return started, train, tf


def _cpu_seconds() -> float:
    """CPU seconds of this process and of every child it waited for (theirs included)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _annotate_xml(xml: str, properties: dict) -> None:
    """Adds `properties` to the first <testsuite> of pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    try:
        tree = ET.parse(xml)
    except (OSError, ET.ParseError):
        return
    root = tree.getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return
    props = suite.find("properties")
    if props is None:
        props = ET.Element("properties")
        suite.insert(0, props)
    for name, value in properties.items():
        ET.SubElement(props, "property", name=name, value=str(value))
    tree.write(xml, encoding="utf-8", xml_declaration=True)


import pytest  # noqa: E402 (after the environment it reads)


def _test_files() -> list:
    if len(sys.argv) > 1:
        return sys.argv[1:]
    if os.environ.get("CAIRN_TEST_MODULE"):  # cairn_py_test sets it (several targets may run one file;
        return os.environ["CAIRN_TEST_MODULE"].split(",")  # cairn_py_test_group, several files in one)
    target = os.environ.get("TEST_TARGET", "")
    if not target.startswith("//") or ":" not in target:
        raise SystemExit("pytest_main: give test files, or run under `bazel test`")
    package, name = target[2:].split(":", 1)
    return [os.path.join(package, name + ".py")]


def _outside_bazel_import_paths(files: list) -> None:
    """Outside Bazel, each test file's folder goes on the import path (for this process and
    its children), as the `imports = ["."]` of the folder's `:util` py_library does in Bazel, and
    so does tests/fixtures (the shared fixtures' `imports`)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fixtures = os.path.join(repo, "tests", "fixtures")
    folders = sorted({os.path.dirname(os.path.abspath(f)) for f in files} | {fixtures})
    sys.path[:0] = folders
    os.environ["PYTHONPATH"] = os.pathsep.join(folders + [p for p in [os.environ.get("PYTHONPATH")] if p])


def main() -> int:
    files = _test_files()
    if len(sys.argv) > 1:
        _outside_bazel_import_paths(files)
    args = files + [
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "-o",
        "python_files=*_test.py test_*.py",
    ]
    log = _process_log()
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    code = pytest.main(args)
    forks = sys.modules.get("forks")  # tests/fixtures/forks.py: its spawners reap their runs first
    if forks is not None and hasattr(forks, "close_all"):
        forks.close_all()
    started, train, tf = _count_processes(log)
    if xml:
        _annotate_xml(
            xml,
            {
                "wall_s": f"{time.monotonic() - _START:.2f}",
                "cpu_s": f"{_cpu_seconds():.2f}",
                "processes": started,
                "train_processes": train,
                "tensorflow_processes": tf + ("tensorflow" in sys.modules),
            },
        )
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if outputs and os.path.exists(log):  # kept with the test's outputs: which child cost what
        import shutil

        shutil.copyfile(log, os.path.join(outputs, "processes.jsonl"))
    if not os.environ.get("TEST_TMPDIR"):
        os.unlink(log)
    return code


if __name__ == "__main__":
    sys.exit(main())
