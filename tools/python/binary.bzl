"""`cairn_py_binary`: a py_binary whose single source is its main module (PEP 420 runfiles)."""

def cairn_py_binary(name, main, deps = [], data = [], visibility = ["//visibility:public"], testonly = False):
    native.py_binary(
        name = name,
        srcs = [main],
        main = main,
        data = data,
        legacy_create_init = False,
        python_version = "PY3",
        srcs_version = "PY3",
        visibility = visibility,
        testonly = testonly,
        deps = deps,
    )
