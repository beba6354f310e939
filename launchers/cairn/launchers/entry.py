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

No JAX, TensorFlow or ml-collections import here: `verify` and `plot_loss` stay light.
"""

from __future__ import annotations

import cairn.launchers.startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

EXIT_CODE = 2  # bad input: a config, a flag, data or a path the user can fix

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


def fail(error: BaseException | str, prefix: str = "error") -> NoReturn:
    """Prints `<prefix>: <error>` on stderr and exits with status 2."""
    print(f"{prefix}: {error}", file=sys.stderr)
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
