"""Resume safety: a model_dir that holds a run of a different config is refused, not mixed.

`train` compares the config it is about to run with `<model_dir>/config.json` (the config the
run there was trained with) before anything is written. Keys in `ALLOWED_ON_RESUME` may change
(how long, how often to log, evaluate or save, where the data lives); any other difference is a
`ConfigError` listing each key (old -> new) and the two ways on: a new `model_dir`, or
`--allow_changed=key,...` to resume anyway with those keys changed. Values derived from an
allowed key (the tiny runs' warmup follows `num_train_steps` through a field reference) follow
it: given the experiment's config with its references, the allowed keys are set back to their
saved values before comparing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from absl import flags

from cairn import storage
from cairn.launchers import config_io, schema
from cairn.launchers.validation import ConfigError

ALLOW_CHANGED = flags.DEFINE_list(
    "allow_changed",
    [],
    "config keys (or sections) that may differ from model_dir's config.json when resuming, e.g. optimizer.warmup_steps",
)

# Keys (or whole sections) that may change on resume by default, and why.
ALLOWED_ON_RESUME: dict[str, str] = {
    "num_train_steps": "training continues to the new last step (how long, not how)",
    "trainer.log_every": "logging cadence",
    "trainer.eval_every": "evaluation cadence",
    "trainer.checkpoint_every": "checkpoint cadence",
    "trainer.keep_checkpoints": "how many checkpoints are kept",
    "trainer.tensorboard": "an output format",
    "trainer.offload_optimizer_state": "where the optimizer state lives, not what it is",
    "trainer.offload_params": "where the parameters live between steps, not what they are",
    "trainer.compiler_options": "how XLA compiles the step (scheduling, memory), not what it computes",
    "fingerprint_every": "run-fingerprint cadence",
    "eval": "evaluation reads the params, it does not change them",
    "post_training": "runs after training",
    "model_dir": "where the run is",
    "data.cache_dir": "where the cached data lives (its content is fingerprinted)",
    "data.check_source_files": "how much of the cache is checked at start-up",
    "data.cache_with_beam": "how a missing cache is written",
    "multihost": "how the processes meet",
    "partitioning": "the layout: a checkpoint restores onto any mesh and the batches do not depend on it",
}


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of a plain dict (mappings flattened, an empty one
    leaves nothing; lists kept)."""
    if not isinstance(value, dict):
        return {prefix[:-1]: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_leaves(v, f"{prefix}{k}."))
    return out


def _covered(key: str, names: list[str] | tuple[str, ...]) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def _default(key: str) -> Any:
    """The schema default of `key` as config.json holds it (tuples as lists); a sentinel for a
    key the schema does not declare."""
    try:
        return json.loads(json.dumps(schema.key(key).default))
    except KeyError:
        return _NO_DEFAULT


_NO_DEFAULT = object()


def differences(old: dict, new: dict, allowed: list[str] | tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """`(key, old, new)` of each leaf that differs between two plain configs, leaving out the
    keys of `ALLOWED_ON_RESUME` and `allowed`. A key the old config lacks (written before the
    key existed) that holds its schema default now is no difference."""
    a, b = _leaves(old), _leaves(json.loads(json.dumps(new)))
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        if _covered(key, tuple(ALLOWED_ON_RESUME)) or _covered(key, allowed):
            continue
        before, after = a.get(key, missing), b.get(key, missing)
        if before is missing and after == _default(key):
            continue
        if before != after:
            out.append((key, "(absent)" if before is missing else before, "(absent)" if after is missing else after))
    return out


def _check_allowed(names: list[str]) -> None:
    """`ConfigError` for a name that is neither a key, a section, nor a key of a free-form mapping."""
    known = {k.path for k in schema.keys()} | set(schema.sections())
    for name in names:
        if name not in known and not any(name.startswith(f + ".") for f in schema.FREE_FORM):
            raise ConfigError(name, f"--allow_changed names an unknown config key {name!r}")


def _with_old_allowed_values(raw: Any, old: dict) -> dict:
    """`stored_form` of `raw` (a config with its field references) with each scalar key of
    `ALLOWED_ON_RESUME` set back to its value in `old`: the values derived from those keys follow."""
    probe = copy.deepcopy(raw)
    flat = _leaves(old)
    for key in ALLOWED_ON_RESUME:
        if key in flat and key not in config_io.PATH_KEYS and not isinstance(flat[key], (dict, list)):
            try:
                config_io.set_path(probe, key, flat[key])
            except (KeyError, AttributeError, TypeError):
                continue
    return config_io.stored_form(config_io.resolve_paths(probe))


def _same_paths_as_new(old: dict, plain: Mapping[str, Any], new: dict) -> None:
    """Writes into `old` the new stored form of each path key naming the same file as before
    (`runs/a` then, `/home/me/runs/a` now, run from /home/me)."""
    for key in config_io.PATH_KEYS:
        try:
            before, now = config_io.get_path(old, key), config_io.get_path(plain, key)
        except (KeyError, TypeError, AttributeError):
            continue
        if isinstance(before, str) and before and "://" not in before:
            if config_io.absolute_path(before) == now:
                config_io.set_path(old, key, config_io.get_path(new, key))


def check(
    stored: Mapping[str, Any], plain: Mapping[str, Any], allowed: list[str] | None = None, raw: Any = None
) -> None:
    """`ConfigError` (on `model_dir`) when `<model_dir>/config.json` holds a config that differs
    from `stored` (the config as config.json stores it: `RunSpec.stored`; `plain`: with its paths
    resolved, `RunSpec.plain`) in keys neither `ALLOWED_ON_RESUME` nor `allowed` (default: the
    `--allow_changed` flag) covers. `raw`: the loaded config before `config_io.resolve_paths`,
    with its field references (values derived from an allowed key then follow it). A model_dir
    without config.json is a new run."""

    allowed = list(ALLOW_CHANGED.value if allowed is None else allowed)
    _check_allowed(allowed)
    try:
        old = json.loads(storage.read_text(storage.join(plain["model_dir"], "config.json")))
    except FileNotFoundError:
        return
    except ValueError:
        old = {}
    if not isinstance(old, dict):
        old = {}
    new = copy.deepcopy(dict(stored))
    _same_paths_as_new(old, plain, new)
    probe = new
    if raw is not None and config_io.stored_form(config_io.resolve_paths(raw)) == new:
        probe = _with_old_allowed_values(raw, old)
    diff = differences(old, probe, allowed)
    if not diff:
        return
    now = _leaves(json.loads(json.dumps(new)))
    listed = "; ".join(f"{k}: {_show(a)} -> {_show(now.get(k, b))}" for k, a, b in diff)
    keys = ",".join(k for k, _, _ in diff)
    raise ConfigError(
        "model_dir",
        f"{plain['model_dir']} holds a run with a different config ({listed}); "
        f"train into a new --config.model_dir, or resume with these changes: --allow_changed={keys}",
    )


def _show(value: Any) -> str:
    return value if isinstance(value, str) and value == "(absent)" else json.dumps(value)
