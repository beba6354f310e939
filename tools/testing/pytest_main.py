"""Runs pytest on the module of the current Bazel test target (`//pkg:name` -> pkg/name.py).

Outside Bazel, pass the test files as arguments. Every test sees 8 virtual CPU devices
unless XLA_FLAGS says otherwise (docs/design.md §10).
"""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


def _test_files() -> list:
    if len(sys.argv) > 1:
        return sys.argv[1:]
    target = os.environ.get("TEST_TARGET", "")
    if not target.startswith("//") or ":" not in target:
        raise SystemExit("pytest_main: give test files, or run under `bazel test`")
    package, name = target[2:].split(":", 1)
    return [os.path.join(package, name + ".py")]


def main() -> int:
    args = _test_files() + [
        "-q",
        "-p", "no:cacheprovider",
        "--import-mode=importlib",
        "-o", "python_files=*_test.py test_*.py",
    ]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main())
