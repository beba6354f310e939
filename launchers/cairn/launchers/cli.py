"""Command-line plumbing shared by the entry points: `--config=path.py[:arg]` with
`--config.a.b=v` overrides (ml_collections `config_flags`), parsed with clear errors.

`parse_flags` is given to `absl.app.run(flags_parser=...)`: it resolves the config path
against `$BUILD_WORKING_DIRECTORY`, and turns ml_collections' errors for an override of an
unknown key (a traceback) or a value of the wrong type into a `ConfigError` message naming
the key, with exit status 2.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, NoReturn

from absl import flags
from ml_collections import config_flags

from cairn.launchers import config_base, config_io, entry
from cairn.launchers.validation import ConfigError, check_schema, close_names

CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment file: path.py[:arg] (launchers/configs/).", lock_config=False
)


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


def explain_flag_error(argv: list[str], error: Exception) -> ConfigError:
    """The `ConfigError` behind a failed parse of `argv`'s config flags."""
    spec = _config_spec(argv)
    if spec is None:
        return ConfigError("config", "--config=path/to/experiment.py[:arg] is required (see launchers/configs/)")
    try:
        loaded = config_io.load_config_file(spec)
    except FileNotFoundError as e:
        return ConfigError("config", str(e))
    except Exception as e:  # the experiment file itself fails
        return ConfigError("config", f"{spec!r} failed to load: {type(e).__name__}: {e}")
    plain = config_io.to_plain(loaded)
    schema = config_io.to_plain(config_base.base_config())
    known = set(_all_keys(plain)) | set(_all_keys(schema))
    for key, value in _overrides(argv):
        if key not in _all_keys(plain):
            parent = key.rpartition(".")[0]
            siblings = [k for k in known if k.rpartition(".")[0] == parent] or sorted(known)
            close = close_names(key, sorted(known))
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            free = next((f for f in config_base.FREE_FORM if key.startswith(f + ".")), None)
            note = f" (keys of {free!r} can be added in the experiment file, not by an override)" if free else ""
            return ConfigError(
                key, f"unknown key (--config.{key}={value}){note}; {hint}allowed: {', '.join(sorted(siblings))}"
            )
    message = str(error)
    m = re.search(r"--config\.([\w.]+)=?(\S*)", message)
    if m:
        key = m.group(1)
        try:
            current = config_io.get_path(plain, key)
            want = type(current).__name__ if current is not None else "a value"
        except (KeyError, TypeError):
            want = "a value"
        return ConfigError(key, f"cannot parse the override {m.group(2)!r} as {want}: {message.split(': ', 1)[-1]}")
    return ConfigError("config", message)


def parse_flags(argv: list[str]) -> list[str]:
    """`absl.app.run` flags parser: exits 2 with a `ConfigError` message on bad config flags."""
    argv = config_io.resolve_argv(list(argv))
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        entry.fail(explain_flag_error(argv, e))


def fail(error: BaseException) -> NoReturn:
    """Prints a config (or data set-up) error and exits with status 2."""
    entry.fail(error)


def loaded_config() -> Any:
    """The parsed `--config` with its paths resolved (`config_io.resolve_paths`), its schema
    checked: the one schema check of an entry point (the later `validation.check_static` /
    `check_schema` of this unchanged config return at once)."""
    if CONFIG.value is None:
        fail(ConfigError("config", "--config=path/to/experiment.py[:arg] is required (see launchers/configs/)"))
    config = config_io.resolve_paths(CONFIG.value)
    check_schema(config)
    return config


def run_entry_point(
    body: Callable[[Any], int | None],
    expected: tuple[type[BaseException], ...] = (),
    logs: Callable[[], None] | None = None,
    flags_parser: Callable[[list[str]], list[str]] = parse_flags,
    describe: Callable[[BaseException], BaseException | str] | None = None,
) -> None:
    """Runs `body(config)` through `entry.run`: flags parsed by `parse_flags`, the loaded config
    passed in; a `ConfigError` or an `expected` error is one line with exit status 2. `logs`
    sets up logging (default: INFO)."""

    def main() -> int | None:
        if logs is None:
            logging.getLogger().setLevel(logging.INFO)
        else:
            logs()
        return body(loaded_config())

    entry.run(main, expected=(ConfigError, *expected), flags_parser=flags_parser, describe=describe)
