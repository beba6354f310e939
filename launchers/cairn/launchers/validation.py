"""Config checks that run before anything is compiled or written (docs/design.md §5).

Each failure is a `ConfigError` naming the key, what was found and what is allowed; the
entry points print it and exit with status 2, leaving `model_dir` untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import ml_collections

from cairn.launchers import config_base
from cairn.launchers.config_io import to_plain

# Keys whose default is None: their type.
PLACEHOLDER_TYPES = {"optimizer.clip_grad_norm": float, "init.checkpoint_step": int,
                     "multihost.num_processes": int, "multihost.process_id": int}
CHOICES = {
    "model.kind": config_base.model_kinds,  # called when checked: the cairn.models families
    "vocabulary.kind": config_base.VOCABULARY_KINDS,
    "optimizer.name": config_base.OPTIMIZERS,
    "optimizer.schedule": config_base.SCHEDULES,
    "model.loss_normalizing_factor": config_base.LOSS_NORMALIZING_FACTORS,
    "post_training.decode_method": config_base.DECODE_METHODS,
}
POSITIVE = ("num_train_steps", "data.batch_size", "trainer.num_microbatches", "eval.batch_size",
            "multihost.initialization_timeout_seconds")
NON_NEGATIVE = ("fingerprint_every", "multihost.heartbeat_timeout_seconds", "trainer.checkpoint_every", "trainer.keep_checkpoints",
                "trainer.eval_every", "trainer.log_every", "eval.num_examples", "post_training.num_samples",
                "post_training.max_decode_length", "optimizer.warmup_steps", "vocabulary.extra_ids",
                "model.vocab_size")


class ConfigError(ValueError):
    """A config value that cannot work: `key` is the dotted config key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key {key!r}: {message}")
        self.key = key


def close_names(name: str, names: Sequence[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(names), n=n, cutoff=0.5)


def _suggest(name: str, names: Sequence[str]) -> str:
    close = close_names(name, names)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}allowed: {', '.join(sorted(names))}"


def _type_name(t: type) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple", dict: "mapping"}.get(t, t.__name__)


def _check_type(key: str, value: Any, default: Any) -> None:
    if key in PLACEHOLDER_TYPES:
        want = PLACEHOLDER_TYPES[key]
        if value is None:
            return
    elif default is None:
        return
    else:
        want = type(default)
    if want is list:
        want = tuple
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str),
          tuple: lambda v: isinstance(v, (list, tuple)),
          dict: lambda v: isinstance(v, dict)}.get(want, lambda v: isinstance(v, want))
    if not ok(value):
        raise ConfigError(key, f"must be {_type_name(want)}, got {type(value).__name__} {value!r}")


def check_schema(config: Any, schema: Optional[Any] = None) -> None:
    """Unknown keys (with the closest known ones), wrong types, values outside their choices."""
    plain = to_plain(config)
    schema_plain = to_plain(schema if schema is not None else config_base.base_config())

    def walk(node: Mapping, ref: Mapping, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if k not in ref:
                siblings = [f"{prefix}{s}" for s in ref]
                where = f"section {prefix[:-1]!r}" if prefix else "the config"
                raise ConfigError(key, f"unknown key in {where}; {_suggest(key, siblings)}")
            if key in config_base.FREE_FORM:
                if not isinstance(v, dict):
                    raise ConfigError(key, f"must be a mapping, got {type(v).__name__} {v!r}")
                continue
            if isinstance(ref[k], dict):
                if not isinstance(v, dict):
                    raise ConfigError(key, f"must be a section (keys {', '.join(sorted(ref[k]))}), got {v!r}")
                walk(v, ref[k], key + ".")
            else:
                _check_type(key, v, ref[k])

    walk(plain, schema_plain, "")
    for key, allowed in CHOICES.items():
        allowed = allowed() if callable(allowed) else allowed
        value = _get(plain, key)
        if value not in allowed:
            raise ConfigError(key, f"unknown value {value!r}; {_suggest(str(value), allowed)}")
    for key in POSITIVE:
        if _get(plain, key) < 1:
            raise ConfigError(key, f"must be >= 1, got {_get(plain, key)}")
    for key in NON_NEGATIVE:
        if _get(plain, key) < 0:
            raise ConfigError(key, f"must be >= 0, got {_get(plain, key)}")
    for name, length in plain["data"]["sequence_length"].items():
        if not isinstance(length, int) or isinstance(length, bool):
            raise ConfigError(f"data.sequence_length.{name}", f"must be int, got {length!r}")
    for axis, size in plain["partitioning"]["mesh"].items():
        if axis not in config_base.MESH_AXES:
            raise ConfigError(f"partitioning.mesh.{axis}", f"unknown mesh axis; {_suggest(axis, config_base.MESH_AXES)}")
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ConfigError(f"partitioning.mesh.{axis}", f"must be a positive int or -1, got {size!r}")
    # Multi-slice: the slice count, and how many slices each mesh axis spans (sizes against the
    # device count are checked when the mesh is built, `builder.make_partitioner`).
    slices = plain["partitioning"].get("num_slices", 1)
    if slices < 1:
        raise ConfigError("partitioning.num_slices", f"must be >= 1, got {slices}")
    dcn = plain["partitioning"].get("dcn_mesh", {})
    for axis, size in dcn.items():
        if size < 1 and size != -1:
            raise ConfigError(f"partitioning.dcn_mesh.{axis}", f"must be a positive int or -1, got {size!r}")
    free = [axis for axis, size in dcn.items() if size == -1]
    spanned = 1
    for size in dcn.values():
        spanned *= size if size != -1 else 1
    if len(free) > 1:
        raise ConfigError("partitioning.dcn_mesh", f"at most one axis may be -1, got {dcn}")
    if free and slices % spanned:
        raise ConfigError("partitioning.dcn_mesh", f"{dcn}: the fixed axes span {spanned} slices, which does not "
                                                   f"divide partitioning.num_slices={slices}")
    if not free and spanned != slices:
        raise ConfigError("partitioning.dcn_mesh", f"{dcn} spans {spanned} slices, but partitioning.num_slices is "
                                                   f"{slices}; the product of its sizes must be {slices}")
    for axis, size in dcn.items():
        span, mesh_size = (slices // spanned if size == -1 else size), plain["partitioning"]["mesh"].get(axis, 1)
        if mesh_size != -1 and mesh_size % span:
            raise ConfigError(f"partitioning.dcn_mesh.{axis}",
                              f"axis {axis!r} spans {span} slices, but partitioning.mesh.{axis}={mesh_size} is not "
                              f"a multiple of {span} (each slice holds mesh.{axis} / dcn_mesh.{axis} of it)")


def _get(plain: Mapping, key: str) -> Any:
    node: Any = plain
    for part in key.split("."):
        node = node[part]
    return node


def check_model(config: Any) -> Any:
    """The preset exists, fits `model.kind`, and `model.overrides` names its fields. Returns
    the preset's config with the overrides applied (vocab size not yet set)."""
    from cairn.models import PRESETS

    preset = config.model.preset
    if preset not in PRESETS:
        raise ConfigError("model.preset", f"unknown preset {preset!r}; {_suggest(preset, list(PRESETS))}")
    base = PRESETS[preset]
    family = config_base.model_family(config.model.kind)
    if preset not in family.presets:
        raise ConfigError("model.preset", f"{preset!r} is not a {family.name} preset; "
                                          f"{family.name} presets: {', '.join(family.presets)}")
    fields = {f.name: f for f in dataclasses.fields(base)}
    overrides = to_plain(config.model.overrides)
    for name, value in overrides.items():
        key = f"model.overrides.{name}"
        if name not in fields:
            raise ConfigError(key, f"{type(base).__name__} has no field {name!r}; {_suggest(name, list(fields))}")
        _check_type(key, tuple(value) if isinstance(value, list) else value, getattr(base, name))
    try:
        return dataclasses.replace(base, **{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
    except (ValueError, TypeError) as e:
        raise ConfigError("model.overrides", str(e)) from None


def _exists(path: str) -> bool:
    """Whether a local path or a URL exists (an unreachable bucket counts as missing)."""
    from cairn import storage

    if not storage.is_url(path):
        return os.path.exists(path)
    try:
        return storage.path(path).exists()
    except OSError:
        return False


def check_paths(config: Any) -> None:
    if config.vocabulary.kind == "sentencepiece":
        if not config.vocabulary.path:
            raise ConfigError("vocabulary.path", "a SentencePiece vocabulary needs a .model path")
        if not _exists(config.vocabulary.path):
            raise ConfigError("vocabulary.path", f"no such file {config.vocabulary.path!r}")
    for key in ("init.checkpoint", "init.hf_checkpoint"):
        path = config.init[key.split(".")[1]]
        if path and not _exists(path):
            raise ConfigError(key, f"no such path {path!r}")
    if config.init.checkpoint and config.init.hf_checkpoint:
        raise ConfigError("init.hf_checkpoint", "set init.checkpoint or init.hf_checkpoint, not both")
    if config.init.hf_checkpoint and config_base.model_family(config.model.kind).hf is None:
        from cairn.models import families

        with_hf = [f.name for f in families.families() if f.hf is not None]
        raise ConfigError("init.hf_checkpoint", f"Hugging Face import covers {', '.join(with_hf)} models only; "
                                                f"model.kind is {config.model.kind!r}")


def check_data(config: Any, tasks: Mapping[str, Any]) -> None:
    """Sequence lengths against every task's output features and preprocessors.

    `tasks`: name -> Task of the data task (or mixture) and of the evaluation task."""
    lengths = to_plain(config.data.sequence_length)
    needed = config_base.model_family(config.model.kind).features
    for name in needed:
        if name not in lengths:
            raise ConfigError(f"data.sequence_length.{name}",
                              f"missing: a {config.model.kind} model needs lengths for {', '.join(needed)}; "
                              f"given: {', '.join(sorted(lengths)) or 'none'}")
    for task in tasks.values():
        for feature_name, feature in task.output_features.items():
            if feature_name not in needed:
                continue
            length = lengths[feature_name]
            least = 2 if feature.add_eos else 1
            if length < least:
                raise ConfigError(f"data.sequence_length.{feature_name}",
                                  f"{length} cannot hold one token{' and EOS' if feature.add_eos else ''} "
                                  f"of task {task.name!r}; it must be >= {least}")
        for fn in task.preprocessors:
            # Each preprocessor states its own length rule (a `Preprocessor`; plain functions
            # are wrapped, partials keep their bound arguments).
            from cairn.datatasks.preprocessors import as_preprocessor

            problem = as_preprocessor(fn).check_sequence_length(lengths)
            if problem:
                raise ConfigError("data.sequence_length", f"task {task.name!r}: {problem}")


def mesh_shapes(device_count: int) -> list[dict[str, int]]:
    """Every (data, fsdp, model) shape whose product is `device_count`."""
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    shapes = [{"data": d, "fsdp": f, "model": device_count // (d * f)}
              for d, f in itertools.product(divisors, divisors) if device_count % (d * f) == 0]
    return sorted(shapes, key=lambda s: (-s["data"], -s["fsdp"]))


def suggest_mesh(mesh: Mapping[str, int], device_count: int) -> dict[str, int]:
    """A mesh for `device_count` devices close to `mesh`: its model and fsdp sizes cut to what
    divides the devices, data parallelism for the rest."""
    import math

    model = math.gcd(max(1, int(mesh.get("model", 1))), device_count)
    fsdp = math.gcd(max(1, int(mesh.get("fsdp", 1))), device_count // model)
    return {"data": device_count // (model * fsdp), "fsdp": fsdp, "model": model}


def resolve_mesh(mesh: Mapping[str, int], device_count: int, process_count: int = 1) -> dict[str, int]:
    """The mesh with its -1 axis filled in; `ConfigError` naming the mesh, the process and device
    counts and a mesh that fits when it does not fit the devices."""
    mesh = {a: int(mesh.get(a, 1)) for a in config_base.MESH_AXES}
    free = [a for a, s in mesh.items() if s == -1]
    where = (f"{process_count} process(es) x {device_count // max(1, process_count)} device(s) = "
             f"{device_count} devices")
    fits = f"a mesh that fits: {suggest_mesh({a: s for a, s in mesh.items() if s != -1}, device_count)}"
    if len(free) > 1:
        raise ConfigError("partitioning.mesh", f"at most one axis may be -1, got {mesh}; {fits}")
    fixed = 1
    for a, s in mesh.items():
        if s != -1:
            fixed *= s
    if free:
        if device_count % fixed:
            raise ConfigError("partitioning.mesh", f"{mesh}: the fixed axes need a multiple of {fixed} devices, "
                                                   f"but there are {where}; {fits}")
        mesh[free[0]] = device_count // fixed
    elif fixed != device_count:
        raise ConfigError("partitioning.mesh", f"{mesh} needs {fixed} devices, but there are {where}; {fits}")
    return mesh


def check_mesh(config: Any, device_count: int, process_count: int = 1) -> dict[str, int]:
    """The config's mesh, resolved; `ConfigError` when it does not fit the devices."""
    return resolve_mesh(to_plain(config.partitioning.mesh), device_count, process_count)


def check_batch_size(config: Any, key: str, parts: int, shards: int, mesh: Mapping[str, int],
                     process_count: int = 1) -> None:
    """The batch size at `key` splits evenly over the `parts` devices the batch dimension is
    sharded over and the `shards` data-parallel host shards (`DataLayout.num_shards`); the
    training batch also over its microbatches."""
    batch = _get(to_plain(config), key)
    layout = f"mesh {dict(mesh)} on {process_count} process(es)"
    if batch % parts:
        raise ConfigError(key, f"{batch} does not divide over the {parts} data-parallel shards of {layout}; "
                               f"use a multiple of {parts}")
    if batch % shards:
        raise ConfigError(key, f"{batch} does not divide over the {shards} host data shards of {layout}; "
                               f"use a multiple of {shards}")
    if key == "data.batch_size" and batch % (parts * config.trainer.num_microbatches):
        raise ConfigError("trainer.num_microbatches",
                          f"{config.trainer.num_microbatches} microbatches of a {batch}-row batch over "
                          f"{parts} data-parallel shards of {layout} do not divide evenly")


def check_static(config: ml_collections.ConfigDict) -> Any:
    """Everything that needs neither devices nor data: schema, model, paths. Returns the
    model config (see `check_model`)."""
    check_schema(config)
    model_config = check_model(config)
    check_paths(config)
    return model_config
