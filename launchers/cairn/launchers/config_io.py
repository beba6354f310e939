"""Loading experiment files, resolving the paths a user typed, and writing the resolved config.

`bazel run` executes in the runfiles tree, so a relative path typed on the command line is
resolved against `$BUILD_WORKING_DIRECTORY` (the directory `bazel run` was started in) when
that variable is set, else against the current directory.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from cairn import storage
from cairn.launchers import schema

# Config keys that hold paths (resolved against the user's directory).
PATH_KEYS = (
    "model_dir",
    "vocabulary.path",
    "data.cache_dir",
    "init.checkpoint",
    "init.hf_checkpoint",
    "init.t5x_checkpoint",
    "init.upcycle_from",
)
# Left out of the config hash: where a run writes, and how its processes meet.
# Where a run writes and reads, not what it computes (the data fingerprint covers the cache's
# content wherever it lives): left out of the run fingerprint's config hash.
HASH_EXCLUDED = ("model_dir", "multihost", "data.cache_dir")
# Resolved path -> the relative path the user gave (or the default model_dir), so that
# config.json stores paths as given (`stored_form`), and a saved config loads the same way.
# Filled by `resolve_path`; `resolve_paths` starts it afresh (one config per program).
_AS_GIVEN: dict[str, str] = {}


class ConfigFileError(ValueError):
    """An experiment file or saved config that cannot be loaded: `where` is `file[:line]`."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


def user_dir() -> str:
    """Where the user's relative paths start: `$BUILD_WORKING_DIRECTORY` under `bazel run`."""
    return os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()


def relative_to_user_dir(path: str) -> str:
    """An absolute `path` relative to `user_dir()` when it lies below it, else unchanged."""
    base = user_dir()
    if os.path.isabs(path) and os.path.commonpath([base, path]) == base:
        return os.path.relpath(path, base)
    return path


def absolute_path(path: str) -> str:
    """`path` made absolute against `user_dir()` (`~` expanded; URLs and empty unchanged)."""
    if not path or "://" in path:
        return path
    return os.path.normpath(os.path.join(user_dir(), os.path.expanduser(path)))


def resolve_path(path: str) -> str:
    """`absolute_path(path)`, remembering a relative `path` as given (for `stored_form`)."""
    resolved = absolute_path(path)
    if path and "://" not in path and not os.path.isabs(os.path.expanduser(path)):
        _AS_GIVEN[resolved] = path
    return resolved


def resolve_config_arg(value: str) -> str:
    """`--config=path.py[:arg]` with the path resolved against `user_dir()` if it exists there
    (else left for ml_collections to find, e.g. in the runfiles tree)."""
    path, sep, arg = value.partition(":")
    candidate = resolve_path(path)
    if path and not os.path.isabs(os.path.expanduser(path)) and os.path.exists(candidate):
        path = candidate
    return path + sep + arg


def resolve_argv(argv: list[str]) -> list[str]:
    """`argv` with the `--config` file path resolved (`--config=x` and `--config x`)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--config="):
            out.append("--config=" + resolve_config_arg(a[len("--config=") :]))
        elif a == "--config" and i + 1 < len(argv):
            out += [a, resolve_config_arg(argv[i + 1])]
            i += 1
        else:
            out.append(a)
        i += 1
    return out


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """`get_config(arg)` of an experiment file given as `path.py[:arg]`, or a run's saved
    `config.json` (no flags involved). `FileNotFoundError` when there is no such file;
    `ConfigFileError` naming `file:line` when the file fails (a syntax error, a bad import...)."""
    path, _, arg = resolve_config_arg(spec).partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    if path.endswith(".json"):
        return load_saved_config(path)
    module_spec = importlib.util.spec_from_file_location("cairn_experiment_config", path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigFileError(path, "not a Python file (an experiment file .py or a saved config.json)")
    try:
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigFileError(path, "defines no get_config()")
        return module.get_config(arg) if arg else module.get_config()
    except ConfigFileError:
        raise
    except SyntaxError as e:
        raise ConfigFileError(f"{e.filename or path}:{e.lineno}", f"syntax error: {e.msg}") from e
    except Exception as e:  # the experiment file's own code fails (a bad import, a typo...)
        raise ConfigFileError(_where(path, e), f"{type(e).__name__}: {e}") from e


def _where(path: str, error: BaseException) -> str:
    """`path:line` of the last traceback frame of `error` in the file `path` (else `path`)."""
    line = None
    tb = error.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"{path}:{line}" if line else path


def load_saved_config(path: str) -> ml_collections.ConfigDict:
    """A run's `config.json` as a config: `base_config()` with the saved values (lists of tuple
    keys as tuples, the free-form mappings as saved); keys the schema does not know are kept
    for `validation.check_schema` to name."""
    try:
        with open(path, encoding="utf-8") as f:
            plain = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigFileError(f"{path}:{e.lineno}", f"not valid JSON: {e.msg}") from e
    if not isinstance(plain, dict):
        raise ConfigFileError(path, "a saved config is a JSON object")
    config = schema.base_config()
    _fill(config, plain, "", path)
    return config


def _fill(node: ml_collections.ConfigDict, values: dict, prefix: str, path: str) -> None:
    keys = {k.path: k for k in schema.keys()}
    for name, value in values.items():
        dotted = prefix + name
        current = node.get(name)
        if isinstance(current, ml_collections.ConfigDict) and isinstance(value, dict):
            if dotted in schema.FREE_FORM or dotted in keys:  # a mapping key: replaced as a whole
                node[name] = ml_collections.ConfigDict(value)
            else:
                _fill(current, value, dotted + ".", path)
            continue
        if isinstance(value, list) and dotted in keys and keys[dotted].type is tuple:
            value = tuple(value)
        try:
            node[name] = value
        except TypeError as e:
            raise ConfigFileError(path, f"key {dotted!r}: {e}") from e


def parse_literal(raw: str, like: Any = None) -> Any:
    """A command-line value: of the type of `like` when it is not None (`true`/`false` for a
    bool), else a Python literal (`0.1`, `True`, `(1, 2)`), `true`/`false`, or the string."""
    if isinstance(like, bool) or (like is None and raw.lower() in ("true", "false")):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if like is not None and isinstance(like, (int, float, str)):
        return type(like)(raw)
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def get_path(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def set_path(config: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def default_model_dir(experiment: str) -> str:
    """`runs/<experiment>`, relative to where the command was run (`user_dir()`)."""
    return os.path.join("runs", experiment or "experiment")


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "cairn", "tasks")


def resolve_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` with every path absolute and the empty defaults filled in."""
    config = ml_collections.ConfigDict(config.to_dict())  # unlocked copy, references resolved
    _AS_GIVEN.clear()  # the paths as given are those of the config resolved last
    if not config.model_dir:
        config.model_dir = default_model_dir(config.experiment)
    for key in PATH_KEYS:
        try:
            value = get_path(config, key)
        except (KeyError, AttributeError):
            continue
        if isinstance(value, str):
            set_path(config, key, resolve_path(value))
    if not config.data.cache_dir:
        config.data.cache_dir = default_cache_dir()
    return config


def to_plain(value: Any) -> Any:
    """A JSON-able copy of a ConfigDict (tuples as lists)."""
    if isinstance(value, ml_collections.ConfigDict):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, ml_collections.FieldReference):
        return to_plain(value.get())
    return value


def hashable_config(stored: Mapping[str, Any]) -> dict:
    """`stored` (the config as `config.json` stores it, paths as the user gave them) without
    `HASH_EXCLUDED` (`model_dir`, `multihost`, `data.cache_dir`): what the run fingerprint's
    config hash covers. A relative path hashes the same from any checkout or working directory
    (the data fingerprint covers the vocabulary's content, wherever it is read from)."""
    plain = copy.deepcopy(dict(stored))
    for key in HASH_EXCLUDED:
        *parents, last = key.split(".")
        node = plain
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    return plain


def as_given(plain: Mapping[str, Any]) -> dict:
    """What `config.json` holds: a plain, path-resolved config with each path the user gave
    relative (and the default model_dir) written as given, relative to where the command ran."""
    stored = copy.deepcopy(dict(plain))
    for key in PATH_KEYS:
        try:
            value = get_path(stored, key)
        except (KeyError, TypeError):
            continue
        if isinstance(value, str) and value in _AS_GIVEN:
            set_path(stored, key, _AS_GIVEN[value])
    return stored


def stored_form(config: ml_collections.ConfigDict) -> dict:
    """`as_given` of a loaded config (`resume_check`'s probes of the config as given)."""
    return as_given(to_plain(config))


def config_text(stored: Mapping[str, Any]) -> str:
    """`stored` (`as_given`: `RunSpec.stored`) as the JSON text of `config.json` (loadable with `--config`)."""
    return json.dumps(stored, indent=2, sort_keys=True) + "\n"


def write_config_json(stored: Mapping[str, Any], model_dir: str) -> str:
    """Writes `<model_dir>/config.json` (`config_text(stored)`) atomically (a rename locally, one
    upload on a bucket); returns its path."""
    path = storage.join(model_dir, "config.json")
    storage.write_text(path, config_text(stored))
    return path
