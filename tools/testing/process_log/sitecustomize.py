"""What every Python process a test starts does first: records itself (tools/ci/test_times.py
counts them), and compiles with the tests' XLA options.

`tools/testing/pytest_main.py` puts this folder on the PYTHONPATH of the processes a test
starts and names a log in `CAIRN_TEST_PROCESS_LOG`; every interpreter that starts with both
appends one JSON line (its pid and command line) to that log, and at a normal exit another
(whether it imported TensorFlow, its CPU seconds). One `write` on a file opened for appending,
so lines from concurrent processes never interleave.

With `CAIRN_TEST_FAST=1` (pytest_main sets it; the standard runs' genrule too), two start-up
settings that change nothing a test checks, and save most of a process's CPU on tiny models:

- `XLA_FLAGS` gets `TEST_XLA_FLAGS`: XLA:CPU compiles without LLVM's optimisation passes,
  with its classic loop-fusion emitters instead of the MLIR fusion emitters, on one codegen
  thread.
  Compiling is most of a test's CPU time, and these take about half of it off (docs/testing.md,
  "Compile fast"); the programs run slower, which tiny models do not notice.
  Results are not bit-identical to optimised code, so every process whose bits a test compares
  must run with the same options: hence here, in every process, not test by test.
- `TF_USE_LEGACY_KERAS=1`: TensorFlow's import then looks for `tf_keras` (not installed) instead
  of importing Keras 3's optimizers for its SavedModel registry, and goes on without (about
  1.5 s of CPU less per process that imports TensorFlow). Nothing in Cairn uses `tf.keras`.

`CAIRN_TEST_FAST=0` keeps XLA's and TensorFlow's own behaviour.

Outside a test nothing is set and this does nothing.
"""

import json
import os
import sys

_log = os.environ.get("CAIRN_TEST_PROCESS_LOG")

# XLA:CPU without LLVM's optimisation passes, with its classic fusion emitters, and one codegen
# thread (see the module docstring).
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)


def with_test_xla_flags(xla_flags: str) -> str:
    """`xla_flags` with each of `TEST_XLA_FLAGS` it does not set already appended."""
    present = {flag.split("=")[0] for flag in xla_flags.split()}
    return " ".join([*xla_flags.split(), *(f for f in TEST_XLA_FLAGS if f.split("=")[0] not in present)])


def apply_test_speedups(environ) -> None:
    """The settings of the module docstring, into `environ` (a process's, before JAX or
    TensorFlow is imported), when `CAIRN_TEST_FAST=1`."""
    if environ.get("CAIRN_TEST_FAST") == "1":
        environ["XLA_FLAGS"] = with_test_xla_flags(environ.get("XLA_FLAGS", ""))
        environ.setdefault("TF_USE_LEGACY_KERAS", "1")


apply_test_speedups(os.environ)


def _append(record: dict) -> None:
    try:
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a test's own environment (a read-only tmp) never fails a child for this


def _at_exit() -> None:
    """A second line at a normal exit: whether TensorFlow was imported (about 4 s of every
    process that does) and the CPU seconds used. A killed process or `os._exit` writes none."""
    t = os.times()
    _append({"pid": os.getpid(), "exit": True, "tensorflow": "tensorflow" in sys.modules, "cpu_s": t.user + t.system})


if _log:
    import atexit

    _append({"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv))})
    atexit.register(_at_exit)
