"""`cairn_py_test`: a py_test that runs pytest on one test module.

Each test target runs pytest on its own file (`<name>.py`) through one shared main, so
`pytest tests/<library>` works outside Bazel too. `size` is required, so every test
has a timeout.

Every test also reads `//:requirements.lock`: the pip packages live in `.venv` (outside
Bazel's view), and `./bazelw` rebuilds `.venv` whenever the lock changes, so making the
lock an input of each test is what lets Bazel cache test results and rerun them when the
pinned packages change.
"""

def cairn_py_test(name, size, deps = [], data = [], **kwargs):
    native.py_test(
        name = name,
        srcs = [name + ".py", "//tools/testing:pytest_main.py"],
        main = "//tools/testing:pytest_main.py",
        deps = deps,
        data = data + ["//:requirements.lock"],
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,
        **kwargs
    )
