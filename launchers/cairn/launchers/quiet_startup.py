"""Silences TensorFlow, CUDA, XLA and absl start-up noise, unless `--verbose` (design §7).

Imported first by every entry point (its one import line sits at the top of each `*_main.py`
and of `entry.py`), before TensorFlow or JAX is loaded: the C++ loggers read their environment
variables once, when the library loads. What it does, unless `--verbose` is on the command line:

* `TF_CPP_MIN_LOG_LEVEL=3` (XLA's C++ logs, e.g. cuInit failures), `GRPC_VERBOSITY=ERROR`,
  `GLOG_minloglevel=2`; a variable the user set already is kept;
* TensorFlow's import runs with file descriptor 2 sent to /dev/null: since TensorFlow 2.19 its
  C++ start-up lines (the oneDNN notice, "Could not find cuda drivers", "All log messages
  before absl::InitializeLog()") ignore TF_CPP_MIN_LOG_LEVEL (tensorflow/tensorflow#100442).
  A failing import still raises its Python error; only the C++ lines are dropped;
* Python warnings from jax, jaxlib, flax, orbax, tensorflow and absl are ignored, and the
  `jax`, `tensorflow` and `absl` loggers show errors only (e.g. JAX's "no GPU/TPU found,
  falling back to cpu").

This module imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "GRPC_VERBOSITY": "ERROR", "GLOG_minloglevel": "2"}
NOISY_MODULES = r"(jax|jaxlib|flax|orbax|tensorflow|absl|keras|tf_keras)(\..*)?$"
NOISY_LOGGERS = ("jax", "tensorflow", "absl", "orbax")
QUIET_IMPORTS = ("tensorflow",)  # packages whose import prints C++ start-up lines


@contextlib.contextmanager
def stderr_to_devnull() -> Iterator[None]:
    """File descriptor 2 (C/C++ writes included) goes to /dev/null inside."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _QuietLoader(importlib.abc.Loader):
    """Runs another loader's `exec_module` with stderr sent to /dev/null."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        with stderr_to_devnull():
            self.loader.exec_module(module)


class _QuietImporter(importlib.abc.MetaPathFinder):
    """Finds the `QUIET_IMPORTS` packages (once each) with a `_QuietLoader`."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> Any:
        if name not in QUIET_IMPORTS:
            return None
        sys.meta_path.remove(self)  # the real finders, not this one, look it up
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _QuietLoader(spec.loader)
        return spec


def wants_verbose(argv: Sequence[str]) -> bool:
    """Whether `argv` turns absl's `--verbose` flag on (`--verbose`, `--verbose=true|1`; the last wins)."""
    verbose = False
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg in ("--verbose", "-verbose"):
            verbose = True
        elif arg in ("--noverbose", "-noverbose"):
            verbose = False
        elif arg.startswith(("--verbose=", "-verbose=")):
            verbose = arg.split("=", 1)[1].lower() in ("true", "1", "t", "yes", "y")
    return verbose


def quiet(argv: Sequence[str] | None = None) -> bool:
    """Silences start-up noise unless `argv` (default `sys.argv`) has `--verbose`; returns
    whether it did. Idempotent."""
    if wants_verbose(sys.argv if argv is None else argv):
        return False
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", module=NOISY_MODULES)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if not any(isinstance(f, _QuietImporter) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImporter())
    return True


QUIETED = quiet()
