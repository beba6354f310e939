"""A Python toolchain whose interpreter is the repository's virtual environment.

The default autodetecting toolchain fails on this machine kind, and no rule set may be
downloaded, so the runtime is declared here: `interpreter_path` and `stub_shebang`
point at `<workspace>/.venv/bin/python3`, or at `$BAZEL_PYTHON` when set.
"""

_BUILD = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _venv_python_impl(rctx):
    python = rctx.os.environ.get("BAZEL_PYTHON", "")
    if not python:
        workspace = rctx.path(Label("//:WORKSPACE")).dirname
        python = "%s/.venv/bin/python3" % workspace
    rctx.file("BUILD", _BUILD.format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    environ = ["BAZEL_PYTHON"],
    local = True,
)
