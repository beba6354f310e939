"""`cairn_py_test`: a py_test that runs pytest on one test module (`cairn_py_test_group`: on
several, in one process).

Each test target runs pytest on its own file (`<name>.py`) through one shared main, so
`pytest tests/<library>` works outside Bazel too. `size` is required, so every test
has a timeout.

Every test also reads `//:requirements.lock`, `//:requirements-test.lock` and
`//:requirements-tpu-compiler.lock`: the pip packages live in `.venv` (outside Bazel's view),
and `./bazelw` rebuilds `.venv` whenever a lock changes, so making the locks inputs of each test
is what lets Bazel cache test results and rerun them when the pinned packages change.
"""

# The pins of .venv: the runtime lock, the test-only lock and XLA:TPU's compiler (./bazelw
# installs all three; libtpu into .venv/tpu-compiler).
LOCKS = ["//:requirements.lock", "//:requirements-test.lock", "//:requirements-tpu-compiler.lock"]

# The eight libraries, bottom rung first (docs/design.md §1).
LIBRARIES = ["storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers"]

def _pytest_target(name, size, modules, deps, data, env, **kwargs):
    """A py_test running pytest_main on `modules` (files of this package) in one process."""
    native.py_test(
        name = name,
        srcs = modules + ["//tools/testing:pytest_main.py"],
        main = "//tools/testing:pytest_main.py",
        deps = deps,
        data = data + LOCKS + ["//tools/testing:process_log/sitecustomize.py"],
        env = dict(env, CAIRN_TEST_MODULE = ",".join([native.package_name() + "/" + m for m in modules])),
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,
        **kwargs
    )

def cairn_py_test(name, size, deps = [], data = [], module = None, env = {}, **kwargs):
    """A pytest target; `module` (default `<name>.py`) is the test file, `env` its environment."""
    _pytest_target(name, size, [module or name + ".py"], deps, data, env, **kwargs)

def cairn_py_test_group(name, size, modules, deps = [], data = [], env = {}, **kwargs):
    """One pytest process for several small test modules (`modules`, files of this package):
    what each module pays to start (Python, pytest, JAX, often TensorFlow: 2-6 s of CPU) is paid
    once per group. For modules that share a library and need no process of their own (a test
    of what a fresh interpreter imports, or of process-wide settings, keeps its own target);
    docs/testing.md, "Where the time goes"."""
    _pytest_target(name, size, modules, deps, data, env, **kwargs)

def cairn_per_library_test(name, size, data = [], with_library = [], libraries = LIBRARIES, **kwargs):
    """One target `<name>_<lib>` per library, each running `<name>.py` on that library alone
    (`CAIRN_LIBRARY=<lib>`, which the module reads) with `//<lib>:dist` (its sources, BUILD and
    pyproject.toml) as data, and `//<lib>` as a dep for the libraries in `with_library` (those
    the module imports): a change to one library reruns that library's checks only
    (docs/testing.md, "The dependency graph")."""
    for lib in libraries:
        cairn_py_test(
            name = name + "_" + lib,
            size = size,
            module = name + ".py",
            env = {"CAIRN_LIBRARY": lib},
            data = data + ["//" + lib + ":dist"],
            deps = ["//" + lib] if lib in with_library else [],
            **kwargs
        )
