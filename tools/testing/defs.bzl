"""`cairn_py_test`: a py_test that runs pytest on one test module.

Each test target runs pytest on its own file (`<name>.py`) through one shared main, so
`pytest tests/<library>` works outside Bazel too. `size` is required, so every test
has a timeout.

Every test also reads `//:requirements.lock` and `//:requirements-test.lock`: the pip
packages live in `.venv` (outside Bazel's view), and `./bazelw` rebuilds `.venv` whenever
either lock changes, so making both locks inputs of each test is what lets Bazel cache test
results and rerun them when the pinned packages change.
"""

# The pins of .venv: the runtime lock and the test-only lock (./bazelw installs both).
LOCKS = ["//:requirements.lock", "//:requirements-test.lock"]

def cairn_py_test(name, size, deps = [], data = [], **kwargs):
    native.py_test(
        name = name,
        srcs = [name + ".py", "//tools/testing:pytest_main.py"],
        main = "//tools/testing:pytest_main.py",
        deps = deps,
        data = data + LOCKS + ["//tools/testing:process_log/sitecustomize.py"],
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,
        **kwargs
    )
