"""Command-line plumbing shared by the entry points: `--config=path.py[:arg]` (or a run's
saved `config.json`) with `--config.a.b=v` overrides (ml_collections `config_flags`), parsed
with clear errors; `--help` (the keys from the schema) and `--print_config`.

`parse_flags` is given to `absl.app.run(flags_parser=...)`: it resolves the config path
against `$BUILD_WORKING_DIRECTORY`, and turns ml_collections' errors for an override of an
unknown key (a traceback) or a value of the wrong type, and a config file that fails to load
(`file:line`), into a `ConfigError` message naming the key, with exit status 2. Overrides of
keys under the free-form mappings (`--config.model.overrides.dropout_rate=0.0`) may add keys.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from cairn.launchers import cli_help, config_base, config_io, entry, run_spec
from cairn.launchers.validation import ConfigError, close_names

# The argv ml_collections reads its overrides from: parse_flags' argv without the overrides of
# free-form keys (those are applied by `loaded_config`, and may add keys).
_ARGV: list[str] = []
_FREE_FORM_OVERRIDES: list[tuple[str, str | None]] = []

CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment file: path.py[:arg] (launchers/configs/), or a run's saved config.json.",
    lock_config=False,
    sys_argv=_ARGV,
)
PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "print the resolved config (config.json's JSON, loadable with --config) and exit 0"
)


class _LoadFailed(Exception):
    """A config file that fails to load (not a ValueError, so absl passes it through)."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))
        self.error = error


class _ConfigFileParser(flags.ArgumentParser):
    """The `--config` flag's parser (in place of ml_collections' own): loads through
    `config_io.load_config_file`, so `.json` files (a run's saved config) too, and failures are
    one-line errors naming `file:line`. ml_collections applies the overrides to the result."""

    def parse(self, path: str) -> Any:
        try:
            return config_io.load_config_file(path)
        except FileNotFoundError as e:
            raise _LoadFailed(ConfigError("config", str(e))) from e
        except config_io.ConfigFileError as e:
            raise _LoadFailed(ConfigError("config", str(e))) from e

    def flag_type(self) -> str:
        return "config object"


flags.FLAGS["config"].parser = _ConfigFileParser()


def _overrides(argv: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for i, a in enumerate(argv):
        m = re.match(r"--config\.([\w.]+)(?:=(.*))?$", a)
        if m:
            value = m.group(2)
            if value is None and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
            out.append((m.group(1), value))
    return out


def _config_spec(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a[len("--config=") :]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _all_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        keys.append(key)
        if isinstance(v, dict):
            keys += _all_keys(v, key + ".")
    return keys


def _free_form(key: str) -> str | None:
    """The free-form mapping (`model.overrides`, ...) `key` is a key of, or None."""
    return next((f for f in config_base.FREE_FORM if key.startswith(f + ".") and "." not in key[len(f) + 1 :]), None)


def explain_flag_error(argv: list[str], error: Exception) -> ConfigError:
    """The `ConfigError` behind a failed parse of `argv`'s config flags."""
    spec = _config_spec(argv)
    if spec is None:
        return ConfigError("config", "--config=path/to/experiment.py[:arg] is required (see launchers/configs/)")
    try:
        loaded = config_io.load_config_file(spec)
    except (FileNotFoundError, config_io.ConfigFileError) as e:
        return ConfigError("config", str(e))
    plain, schema = (config_io.to_plain(c) for c in (loaded, config_base.base_config()))
    known = set(_all_keys(plain)) | set(_all_keys(schema))
    overrides = dict(_overrides(argv))
    for key, value in overrides.items():
        if key not in _all_keys(plain) and not _free_form(key):
            parent = key.rpartition(".")[0]
            siblings = [k for k in known if k.rpartition(".")[0] == parent] or sorted(known)
            close = close_names(key, sorted(known))
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            return ConfigError(
                key, f"unknown key (--config.{key}={value}); {hint}allowed: {', '.join(sorted(siblings))}"
            )
    message = str(error)
    m = re.search(r"--config\.([\w.]+)", message)
    if m:
        key = m.group(1)
        try:
            current = config_io.get_path(plain, key)
            want = type(current).__name__ if current is not None else "a value"
        except (KeyError, TypeError):
            want = "a value"
        reason = message.split(": ", 1)[-1]
        return ConfigError(key, f"cannot parse the override {overrides.get(key)!r} as {want}: {reason}")
    return ConfigError("config", message)


def _split_free_form(argv: list[str]) -> tuple[list[str], list[tuple[str, str | None]]]:
    """`argv` without the overrides of keys in free-form mappings, and those overrides."""
    kept: list[str] = []
    free: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        m = re.match(r"--config\.([\w.]+)(?:=(.*))?$", argv[i])
        if m and _free_form(m.group(1)):
            value = m.group(2)
            if value is None and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            free.append((m.group(1), value))
        else:
            kept.append(argv[i])
        i += 1
    return kept, free


def parse_flags(argv: list[str]) -> list[str]:
    """`absl.app.run` flags parser: `--help` prints the flags and every config key (exit 0);
    exits 2 with a `ConfigError` message on bad config flags or a config file that fails."""
    if any(a in cli_help.HELP_FLAGS for a in argv[1:]):
        print(cli_help.help_text(sys.modules["__main__"].__doc__ or ""))
        sys.exit(0)
    argv = config_io.resolve_argv(list(argv))
    argv, free = _split_free_form(argv)
    _ARGV[:] = argv
    _FREE_FORM_OVERRIDES[:] = free
    try:
        return flags.FLAGS(argv)
    except _LoadFailed as e:
        entry.fail(e.error)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        entry.fail(explain_flag_error(argv, e))


def apply_free_form_overrides(config: Any, overrides: list[tuple[str, str | None]]) -> None:
    """Sets each `(key, raw value)` under a free-form mapping, adding keys: typed like the value
    already there, else a Python literal (or the string)."""
    for key, raw in overrides:
        parent, _, name = key.rpartition(".")
        node = config_io.get_path(config, parent)
        if raw is None:
            raise ConfigError(key, f"--config.{key} needs a value")
        try:
            node[name] = config_io.parse_literal(raw, node.get(name))
        except (TypeError, ValueError) as e:
            raise ConfigError(key, f"cannot parse the override {raw!r}: {e}") from None


def fail(error: BaseException) -> NoReturn:
    """Prints a config (or data set-up) error and exits with status 2."""
    entry.fail(error)


def loaded_config() -> run_spec.RunSpec:
    """The parsed `--config` with its paths resolved (`config_io.resolve_paths`) and its schema
    checked (`--print_config` prints it then), resolved into the run's `RunSpec`: the config's one
    crossing into plain values, and each check of it, once."""
    if CONFIG.value is None:
        fail(ConfigError("config", "--config=path/to/experiment.py[:arg] is required (see launchers/configs/)"))
    config = CONFIG.value
    apply_free_form_overrides(config, _FREE_FORM_OVERRIDES)
    plain, keys = run_spec.checked_keys(config_io.resolve_paths(config))
    if PRINT_CONFIG.value:
        print(config_io.config_text(config_io.as_given(plain)), end="")
        sys.exit(0)
    return run_spec.resolve(plain, keys)


def raw_config() -> Any:
    """The parsed `--config` (overrides applied) before its paths are resolved, with the
    experiment file's field references; None before the flags are parsed."""
    return CONFIG.value if flags.FLAGS.is_parsed() else None


def quiet_logs() -> None:
    """cairn's own INFO logs; only warnings from the rest (orbax logs every checkpoint file it
    reads or writes through absl at INFO, TensorFlow's SavedModel writer too). With `--verbose`:
    INFO from everything, cairn's DEBUG too. The `logs` of the entry points that touch
    checkpoints."""
    verbose = entry.VERBOSE.value
    absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.WARNING)
    logging.getLogger("cairn").setLevel(logging.DEBUG if verbose else logging.INFO)


def run_entry_point(
    body: Callable[[run_spec.RunSpec], int | None],
    expected: tuple[entry.Expected, ...] = (),
    logs: Callable[[], None] | None = None,
    flags_parser: Callable[[list[str]], list[str]] = parse_flags,
    describe: Callable[[BaseException], BaseException | str] | None = None,
) -> None:
    """Runs `body(spec)` through `entry.run`: flags parsed by `parse_flags`, the loaded config's
    `RunSpec` passed in; a `ConfigError` or an `expected` error is one line with exit status 2. `logs`
    sets up logging (default: INFO)."""

    def main() -> int | None:
        if logs is None:
            logging.getLogger().setLevel(logging.INFO)
        else:
            logs()
        return body(loaded_config())

    entry.run(main, expected=(ConfigError, *expected), flags_parser=flags_parser, describe=describe)
