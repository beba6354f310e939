"""Loading experiment files, resolving the paths a user typed, and writing the resolved config.

`bazel run` executes in the runfiles tree, so a relative path typed on the command line is
resolved against `$BUILD_WORKING_DIRECTORY` (the directory `bazel run` was started in) when
that variable is set, else against the current directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import ml_collections

from cairn import storage

# Config keys that hold paths (resolved against the user's directory).
PATH_KEYS = ("model_dir", "vocabulary.path", "data.cache_dir", "init.checkpoint", "init.hf_checkpoint")
# Left out of the config hash: where a run writes, and how its processes meet.
# Where a run writes and reads, not what it computes (the data fingerprint covers the cache's
# content wherever it lives): left out of the run fingerprint's config hash.
HASH_EXCLUDED = ("model_dir", "multihost", "data.cache_dir")


def user_dir() -> str:
    """Where the user's relative paths start: `$BUILD_WORKING_DIRECTORY` under `bazel run`."""
    return os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()


def resolve_path(path: str) -> str:
    """`path` made absolute against `user_dir()` (`~` expanded); empty stays empty."""
    if not path:
        return path
    path = os.path.expanduser(path)
    if "://" in path:  # gs://, s3://
        return path
    return os.path.normpath(os.path.join(user_dir(), path))


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
    """`get_config(arg)` of an experiment file given as `path.py[:arg]` (no flags involved)."""
    path, _, arg = resolve_config_arg(spec).partition(":")
    module_spec = importlib.util.spec_from_file_location("cairn_experiment_config", path)
    if module_spec is None or module_spec.loader is None or not os.path.exists(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


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
    return os.path.join(os.path.expanduser("~"), ".cache", "cairn", "runs", experiment or "experiment")


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "cairn", "tasks")


def resolve_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` with every path absolute and the empty defaults filled in."""
    config = ml_collections.ConfigDict(config.to_dict())  # unlocked copy, references resolved
    for key in PATH_KEYS:
        try:
            value = get_path(config, key)
        except (KeyError, AttributeError):
            continue
        if isinstance(value, str):
            set_path(config, key, resolve_path(value))
    if not config.model_dir:
        config.model_dir = default_model_dir(config.experiment)
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


def hashable_config(config: ml_collections.ConfigDict) -> dict:
    """The resolved config as a plain dict without `HASH_EXCLUDED` (`model_dir`, `multihost`,
    `data.cache_dir`): what the run fingerprint's config hash covers."""
    plain = to_plain(config)
    for key in HASH_EXCLUDED:
        *parents, last = key.split(".")
        node = plain
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(last, None)
    return plain


def write_config_json(config: ml_collections.ConfigDict, model_dir: str | None = None) -> str:
    """Writes `<model_dir>/config.json` atomically (a rename locally, one upload on a bucket);
    returns its path."""
    model_dir = model_dir or config.model_dir
    path = storage.join(model_dir, "config.json")
    storage.write_text(path, json.dumps(to_plain(config), indent=2, sort_keys=True) + "\n")
    return path
