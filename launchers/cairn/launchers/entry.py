"""The one way every launcher program runs.

Each entry point (`train`, `eval`, `infer`, `cache_tasks`, `verify_cache`, `jobset`, `verify`,
`plot_loss`) defines its flags with absl and calls `run(body, ...)`:

- flags are parsed by absl (or by the given parser: the config programs use `cli.parse_flags`);
  positional arguments are refused;
- `body()` returns the exit status (None: 0);
- an error of one of the `expected` types (a bad config, bad data, an unusable path...; a type
  may be named "module.Name", see `is_expected`) is one line on stderr, `<prefix>: <message>`,
  exit status 2 -- with a traceback only under `--verbose`;
- anything else is a bug, and keeps Python's traceback;
- `--help` prints the program's docstring and flags and exits 0 (absl's own exits 1).

A program's `if __name__ == "__main__":` line is `entry.main(run)`: when that module is the
process's `__main__` (`python -m`, `bazel run`; console scripts say so), it ends the process as
Python's exit does (thread pools stopped, non-daemon threads joined, `atexit` handlers run,
stdout and stderr flushed) but skips the interpreter's teardown, which frees every module and
object and destroys JAX's backends for nothing: about 0.4 CPU s after a training run
(benchmarks/startup_bench.py). `run()` itself still raises `SystemExit` (a caller in the same
process, a test, gets the status).

No JAX, TensorFlow or ml-collections import here: `verify` and `plot_loss` stay light.
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import atexit
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

EXIT_CODE = 2  # bad input: a config, a flag, data or a path the user can fix
# Put after "error: " on processes other than 0 of a multi-process run (`process_output`), e.g.
# "process 1/4: "; process 0's errors read as on one process.
PROCESS_TAG = ""

VERBOSE = flags.DEFINE_bool("verbose", False, "print a traceback with an error")
HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with `--help` answered first: the main module's docstring and
    flags on stdout, exit 0."""
    if any(a in HELP_FLAGS for a in argv[1:]):
        doc = (sys.modules["__main__"].__doc__ or "").strip()
        print(f"{doc}\n\nFlags:\n{flags.FLAGS.main_module_help()}")
        sys.exit(0)
    return flags.FLAGS(argv)


class UsageError(ValueError):
    """A flag or argument the program cannot use."""


def user_path(path: str) -> str:
    """A path the user typed, resolved against `$BUILD_WORKING_DIRECTORY` under `bazel run`
    (`~` expanded; URLs such as gs:// unchanged)."""
    if "://" in path:
        return path
    path = os.path.expanduser(path)
    base = os.environ.get("BUILD_WORKING_DIRECTORY")
    return os.path.join(base, path) if base and not os.path.isabs(path) else path


def fail(error: BaseException | str, prefix: str = "error") -> NoReturn:
    """Prints `<prefix>: <error>` on stderr (with `PROCESS_TAG` before the error) and exits with
    status 2."""
    print(f"{prefix}: {PROCESS_TAG}{error}", file=sys.stderr)
    sys.exit(EXIT_CODE)


Expected = type[BaseException] | str  # an exception class, or its "module.Name" (see `is_expected`)


def is_expected(error: BaseException, expected: tuple[Expected, ...]) -> bool:
    """Whether `error` is an instance of one of `expected`. A class given as "module.Name" is looked
    up only if its module is already imported: an instance cannot exist before its class, so an
    entry point names heavy modules' errors without importing them (a bad config is refused
    before JAX is imported)."""
    for cls in expected:
        if isinstance(cls, str):
            module, _, name = cls.rpartition(".")
            loaded = sys.modules.get(module)
            if loaded is None:
                continue
            cls = getattr(loaded, name)
        if isinstance(error, cls):
            return True
    return False


def run(
    body: Callable[[], int | None],
    *,
    expected: tuple[Expected, ...] = (),
    prefix: str = "error",
    flags_parser: Callable[[list[str]], list[str]] | None = None,
    describe: Callable[[BaseException], BaseException | str] | None = None,
) -> None:
    """Runs `body` as an absl program (see the module docstring). `describe` turns an expected
    error into what is printed (default: the error itself)."""

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            fail(UsageError(f"unexpected arguments {argv[1:]}"), prefix)
        try:
            code = body()
        except BaseException as e:
            if not is_expected(e, (UsageError, *expected)):
                raise
            if VERBOSE.value:
                traceback.print_exc()
            fail(describe(e) if describe else e, prefix)
        sys.stdout.flush()
        sys.exit(code or 0)

    app.run(main, flags_parser=flags_parser or parse_flags)


def exit_now(code: int | str | None = 0) -> NoReturn:
    """Ends the process with `code` (as `sys.exit(code)` would: None is 0, a string is printed
    on stderr and is 1) after what Python's own exit does first -- thread pools told to stop and
    non-daemon threads joined, `atexit` handlers run (logging's flush, `jax.distributed`'s
    shutdown), stdout and stderr flushed -- without the interpreter's teardown (`os._exit`).
    Every file a program writes is closed by then (`with` blocks, writers closed in `finally`)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    status = 0 if code is None else int(code)
    shutdown = getattr(threading, "_shutdown", None)  # what Python's exit runs first (CPython)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written
            status = status or 120  # Python's own status when flushing at exit fails
    os._exit(status)


def main(program: Callable[[], None], own_process: bool | None = None) -> None:
    """`program()` (an entry point's `run`) as the process: its exit status through `exit_now`.
    An unexpected error keeps Python's traceback and ordinary exit. `own_process` (default:
    whether `program`'s module is the process's `__main__`, as under `python -m` and `bazel
    run`): when false, `program()` only, its `SystemExit` left to the caller (a program that
    runs the module inside its own process, e.g. with `runpy`)."""
    if own_process is None:
        own_process = getattr(sys.modules.get("__main__"), program.__name__, None) is program
    if not own_process:
        program()
        return
    try:
        program()
    except SystemExit as e:
        exit_now(e.code)
    exit_now(0)
