"""Config checks that run before anything is compiled or written (docs/design.md §5).

Each failure is a `ConfigError` naming the key, what was found and what is allowed; the
entry points print it and exit with status 2, leaving `model_dir` untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairn import storage
from cairn.datatasks.preprocessors import as_preprocessor
from cairn.launchers import config_base, schema
from cairn.models import PRESETS, TransformerConfig, families
from cairn.models.moe_config import MoeConfig


class ConfigError(ValueError):
    """A config value that cannot work: `key` is the dotted config key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key {key!r}: {message}")
        self.key = key


_KEYS = {k.path: k for k in schema.keys()}
_SECTIONS = set(schema.sections())


def close_names(name: str, names: Sequence[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(names), n=n, cutoff=0.5)


def _suggest(name: str, names: Sequence[str]) -> str:
    close = close_names(name, names)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}allowed: {', '.join(sorted(names))}"


_TYPE_CHECKS: dict[Any, Callable[[Any], bool]] = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    tuple: lambda v: isinstance(v, (list, tuple)),
    dict: lambda v: isinstance(v, dict),
}


def check_type(key: str, value: Any, want: Any, optional: bool = False) -> None:
    """`ConfigError` naming `key` unless `value` is a `want` (an int passes as a float, a list as
    a tuple; None only when `optional`; `typing.Any` anything)."""
    if want is Any or (optional and value is None):
        return
    ok = _TYPE_CHECKS.get(want, lambda v: isinstance(v, want))
    if not ok(value):
        raise ConfigError(key, f"must be {schema.type_name(want)}, got {type(value).__name__} {value!r}")


def _check_range(path: str, value: Any, k: schema.Key) -> None:
    # `or_minus_one` keys are sizes (mesh axes): min 1, or -1 for "the rest".
    if k.min is None or (k.or_minus_one and value == -1):
        return
    if k.or_minus_one:
        if not _TYPE_CHECKS[int](value) or value < k.min:
            raise ConfigError(path, f"must be a positive int or -1, got {value!r}")
    elif value < k.min:
        raise ConfigError(path, f"must be >= {k.min:g}, got {value}")


def check_value(k: schema.Key, value: Any) -> None:
    """One value against its schema key: type, items of a tuple or mapping, allowed values,
    range. Each failure is a `ConfigError` naming the key (or `key.item`)."""
    if k.or_minus_one and k.type is dict:
        check_type(k.path, value, dict)
    else:
        check_type(k.path, value, k.type, k.optional)
    if value is None:
        return
    if k.type is tuple:
        for i, item in enumerate(value):
            check_type(f"{k.path}[{i}]", item, k.item)
    elif k.type is dict:
        allowed_keys = k.allowed_keys()
        for name, item in value.items():
            path = f"{k.path}.{name}"
            if allowed_keys is not None and name not in allowed_keys:
                raise ConfigError(path, f"unknown key of {k.path!r}; {_suggest(name, allowed_keys)}")
            if not k.or_minus_one:
                check_type(path, item, k.item)
            _check_range(path, item, k)
        return
    allowed = k.allowed()
    if allowed is not None and value not in allowed:
        raise ConfigError(k.path, f"unknown value {value!r}; {_suggest(str(value), allowed)}")
    _check_range(k.path, value, k)


def _walk(node: Mapping, prefix: str) -> None:
    for name, value in node.items():
        path = f"{prefix}{name}"
        if path in _SECTIONS:
            children = sorted(p[len(path) + 1 :] for p in (*_KEYS, *_SECTIONS) if p.rpartition(".")[0] == path)
            if not isinstance(value, dict):
                raise ConfigError(path, f"must be a section (keys {', '.join(children)}), got {value!r}")
            _walk(value, path + ".")
        elif path in _KEYS:
            check_value(_KEYS[path], value)
        else:
            parent = prefix[:-1]
            siblings = [p for p in (*_KEYS, *_SECTIONS) if p.rpartition(".")[0] == parent]
            where = f"section {parent!r}" if parent else "the config"
            raise ConfigError(path, f"unknown key in {where}; {_suggest(path, siblings)}")


def check_schema(plain: Mapping[str, Any]) -> None:
    """A plain config (`config_io.to_plain`) against `schema.Config`, walking it: unknown keys
    (with the closest known ones), types, allowed values and ranges of each key, then the slice
    keys together. Run once per process, by `run_spec.checked_keys`."""
    _walk(plain, "")
    _check_slices(plain.get("partitioning", {}))


def _check_slices(part: Mapping) -> None:
    """Multi-slice: how many slices each mesh axis spans against the slice count (sizes against
    the device count are checked when the mesh is built, `builder.make_partitioner`)."""
    slices, dcn = part.get("num_slices", 1), part.get("dcn_mesh", {})
    free = [axis for axis, size in dcn.items() if size == -1]
    spanned = 1
    for size in dcn.values():
        spanned *= size if size != -1 else 1
    if len(free) > 1:
        raise ConfigError("partitioning.dcn_mesh", f"at most one axis may be -1, got {dcn}")
    if free and slices % spanned:
        raise ConfigError(
            "partitioning.dcn_mesh",
            f"{dcn}: the fixed axes span {spanned} slices, which does not divide partitioning.num_slices={slices}",
        )
    if not free and spanned != slices:
        raise ConfigError(
            "partitioning.dcn_mesh",
            f"{dcn} spans {spanned} slices, but partitioning.num_slices is "
            f"{slices}; the product of its sizes must be {slices}",
        )
    for axis, size in dcn.items():
        span, mesh_size = (slices // spanned if size == -1 else size), part.get("mesh", {}).get(axis, 1)
        if mesh_size != -1 and mesh_size % span:
            raise ConfigError(
                f"partitioning.dcn_mesh.{axis}",
                f"axis {axis!r} spans {span} slices, but partitioning.mesh.{axis}={mesh_size} is not "
                f"a multiple of {span} (each slice holds mesh.{axis} / dcn_mesh.{axis} of it)",
            )


def check_model(config: schema.Config) -> Any:
    """The preset exists, fits `model.kind`, and `model.overrides` names its fields. Returns
    the preset's config with the overrides applied (vocab size not yet set). `config`: the
    typed keys (`schema.typed`), as every check below."""
    preset = config.model.preset
    if preset not in PRESETS:
        raise ConfigError("model.preset", f"unknown preset {preset!r}; {_suggest(preset, list(PRESETS))}")
    base: Any = PRESETS[preset]
    family = config_base.model_family(config.model.kind)
    if preset not in family.presets:
        raise ConfigError(
            "model.preset",
            f"{preset!r} is not a {family.name} preset; {family.name} presets: {', '.join(family.presets)}",
        )
    fields = {f.name: f for f in dataclasses.fields(base)}
    overrides = config.model.overrides
    for name, value in overrides.items():
        key = f"model.overrides.{name}"
        if name not in fields:
            raise ConfigError(key, f"{type(base).__name__} has no field {name!r}; {_suggest(name, list(fields))}")
        default = getattr(base, name)
        optional = value is None and "None" in str(fields[name].type)  # `int | None`: None allowed
        if default is not None and fields[name].type != "Any" and not optional:  # `Any` fields check themselves
            check_type(key, value, tuple if isinstance(default, list) else type(default))
    try:
        net = dataclasses.replace(base, **{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
    except (ValueError, TypeError) as e:
        raise ConfigError("model.overrides", str(e)) from None
    return apply_model_keys(config, net)


# model.<key> -> the network config field of the same name it sets ("preset": left as it is).
MODEL_FIELD_KEYS = ("dtype", "param_dtype", "matmul_precision")


def apply_model_keys(config: schema.Config, net: Any) -> Any:
    """`net` with each `model.<key>` of `MODEL_FIELD_KEYS` that is not "preset" set (`model.dtype=bfloat16`
    for any family), and its `moe` from `model.moe.*` when `model.moe.num_experts` > 0
    (`moe_config`). `ConfigError` naming the key when it contradicts `model.overrides`, or when
    the family has no such field and the value is not float32 (what such a family stores)."""
    fields = {f.name for f in dataclasses.fields(net)}
    overrides = config.model.overrides
    changes = {}
    for name in MODEL_FIELD_KEYS:
        value, key = getattr(config.model, name), f"model.{name}"
        if value == "preset":
            continue
        if name in overrides and overrides[name] != value:
            raise ConfigError(key, f"{value!r} contradicts model.overrides.{name}={overrides[name]!r}; set one")
        if name in fields:
            changes[name] = value
        elif value != "float32":
            raise ConfigError(key, f"{type(net).__name__} stores parameters in float32 only, got {value!r}")
    moe = moe_config(config)
    if moe is not None:
        if "moe" not in fields:
            raise ConfigError("model.moe.num_experts", f"{type(net).__name__} has no routed MLPs (no moe field)")
        changes["moe"] = moe
    if not changes:
        return net
    if "moe" not in changes:
        return dataclasses.replace(net, **changes)
    try:
        return dataclasses.replace(net, **changes)
    except ValueError as e:  # the network's own check of the combination (moe.every with scan_layers)
        raise ConfigError("model.moe.every" if "moe.every" in str(e) else "model.moe.num_experts", str(e)) from None


def moe_config(config: schema.Config) -> Any:
    """The `MoeConfig` of `model.moe.*` (None when `model.moe.num_experts` is 0: the preset's MLPs).
    `ConfigError` naming the key: another `model.moe` key set while num_experts is 0, a value
    `MoeConfig` refuses (`top_k` above `num_experts`, a capacity factor that is not positive,
    ...), or `model.overrides.moe` given as well."""
    defaults = {k.path.rpartition(".")[2]: k.default for k in schema.keys(schema.Moe)}
    values = dataclasses.asdict(config.model.moe)
    num_experts = values.pop("num_experts")
    if not num_experts:
        changed = [name for name, value in values.items() if value != defaults[name]]
        if changed:
            raise ConfigError(
                f"model.moe.{changed[0]}", "has no effect: model.moe.num_experts is 0 (dense MLPs); set num_experts"
            )
        return None
    if "moe" in config.model.overrides:
        raise ConfigError("model.moe.num_experts", "contradicts model.overrides.moe; set one of them")
    return library_config(MoeConfig, config.model.moe, "model.moe", fallback="model.moe.num_experts")


def library_config(cls: type, section: Any, key: str, fallback: str = "", **values: Any) -> Any:
    """The library dataclass `cls` built from the keys of the schema `section` (at config `key`)
    named like its fields, and `values` for the fields set otherwise: a section's keys feed the
    library fields of the same name (`run_spec.LIBRARY_SECTIONS`; schema_test checks that their
    defaults agree). A value `cls` refuses (its `__post_init__`) is a `ConfigError` naming the
    key its message names (else `fallback`, else `key`)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    own = [f.name for f in dataclasses.fields(section)]
    shared = {name: getattr(section, name) for name in own if name in fields}
    try:
        return cls(**{**shared, **values})
    except (ValueError, TypeError) as e:
        named = [name for name in re.findall(r"\b\w+\.(\w+)", str(e)) if name in own]
        raise ConfigError(f"{key}.{named[0]}" if named else (fallback or key), str(e)) from None


def _exists(path: str) -> bool:
    """Whether a local path or a URL exists (an unreachable bucket counts as missing)."""

    if not storage.is_url(path):
        return os.path.exists(path)
    try:
        return storage.path(path).exists()
    except OSError:
        return False


# vocabulary.kind -> what its vocabulary.path must name.
_VOCABULARY_FILES = {
    "sentencepiece": "SentencePiece vocabulary needs a .model",
    "tokenizer_json": "tokenizer_json vocabulary needs a Hugging Face tokenizer.json",
}


def check_paths(config: schema.Config) -> None:
    if config.vocabulary.kind in _VOCABULARY_FILES:
        if not config.vocabulary.path:
            raise ConfigError("vocabulary.path", f"a {_VOCABULARY_FILES[config.vocabulary.kind]} path")
        if not _exists(config.vocabulary.path):
            raise ConfigError("vocabulary.path", f"no such file {config.vocabulary.path!r}")
    sources = ("init.checkpoint", "init.hf_checkpoint", "init.t5x_checkpoint", "init.upcycle_from")
    for key in sources:
        path = getattr(config.init, key.split(".")[1])
        if path and not _exists(path):
            raise ConfigError(key, f"no such path {path!r}")
    given = [key for key in sources if getattr(config.init, key.split(".")[1])]
    if len(given) > 1:
        raise ConfigError(given[-1], f"set one of {', '.join(sources)}, not {' and '.join(given)}")
    if config.init.t5x_checkpoint:
        if not issubclass(config_base.model_family(config.model.kind).config_class, TransformerConfig):
            raise ConfigError(
                "init.t5x_checkpoint", f"t5x checkpoints hold T5-family models; model.kind is {config.model.kind!r}"
            )
    if config.init.upcycle_from and not config.model.overrides.get("moe"):
        raise ConfigError("init.upcycle_from", "upcycles into a mixture of experts: set model.overrides.moe")
    if config.init.hf_checkpoint and config_base.model_family(config.model.kind).hf is None:
        with_hf = [f.name for f in families.families() if f.hf is not None]
        raise ConfigError(
            "init.hf_checkpoint",
            f"Hugging Face import covers {', '.join(with_hf)} models only; model.kind is {config.model.kind!r}",
        )


LORA_BASES = ("init.checkpoint", "init.hf_checkpoint", "init.t5x_checkpoint")


def check_lora(config: schema.Config) -> Any:
    """The run's `cairn.models.lora.LoraConfig` of `model.lora.*` (None when `model.lora.rank` is
    None): a base to adapt (`LORA_BASES`), params kept on the device (`trainer.offload_params`
    is for full training), and `LoraConfig`'s own refusals naming `model.lora.<field>`
    (`library_config`). Whether each target matches a kernel needs the model:
    `optimizer_setup.check_param_patterns`."""
    lora = config.model.lora
    if lora.rank is None:
        return None
    from cairn.models.lora import LoraConfig

    if not any(getattr(config.init, key.split(".")[1]) for key in LORA_BASES):
        raise ConfigError(
            "model.lora.rank",
            f"{lora.rank}: LoRA adapts a base model; set one of {', '.join(LORA_BASES)}"
            + (" (init.upcycle_from makes new experts: train them fully)" if config.init.upcycle_from else ""),
        )
    if config.trainer.offload_params:
        raise ConfigError(
            "trainer.offload_params", "is not supported with LoRA (model.lora.rank): the adapters train on the device"
        )
    return library_config(LoraConfig, lora, "model.lora", fallback="model.lora.targets")


def check_prompt_tuning(config: schema.Config, vocabulary: Any) -> Any:
    """The run's `cairn.models.prompt_tuning.PromptTuningConfig` of `model.prompt_tuning.*` (None
    when its length is None): a base to adapt (`LORA_BASES`), no LoRA beside it, unpacked rows
    (one prompt per row), params on the device, `text` tokenized with `vocabulary` into the
    tokens, ids inside the vocabulary, `sample_top` cut to the vocabulary's ids below its
    sentinels (`vocabulary.extra_ids`), and the config's own refusals naming
    `model.prompt_tuning.<field>` (`library_config`)."""
    pt = config.model.prompt_tuning
    if pt.length is None:
        return None
    from cairn.models.prompt_tuning import PromptTuningConfig

    key = "model.prompt_tuning"
    if not any(getattr(config.init, k.split(".")[1]) for k in LORA_BASES):
        raise ConfigError(
            f"{key}.length", f"{pt.length}: prompt tuning adapts a base model; set one of {', '.join(LORA_BASES)}"
        )
    if config.model.lora.rank is not None:
        raise ConfigError(f"{key}.length", "cannot be combined with LoRA (model.lora.rank): train one of them")
    if config.data.pack:
        why = "is not supported with prompt tuning: one prompt per row cannot precede each packed example"
        raise ConfigError("data.pack", why)
    if config.trainer.offload_params:
        raise ConfigError("trainer.offload_params", f"is not supported with prompt tuning ({key}.length)")
    tokens = tuple(pt.tokens)
    if pt.text:
        if tokens:
            raise ConfigError(f"{key}.text", "give the prompt's start as tokens or as text, not both")
        if pt.init != "tokens":
            raise ConfigError(f"{key}.text", f"is used by init='tokens' only (init is {pt.init!r})")
        tokens = tuple(int(t) for t in vocabulary.encode(pt.text))[: pt.length]
        if not tokens:
            raise ConfigError(f"{key}.text", f"{pt.text!r} has no tokens in the vocabulary")
    bad = [t for t in tokens if not 0 <= t < vocabulary.vocab_size]
    if bad:
        raise ConfigError(f"{key}.tokens", f"ids {bad} are outside the vocabulary's {vocabulary.vocab_size}")
    # vocab_sample draws from the vocabulary's own ids: not the sentinels at its top, nor the rows
    # the model's vocab_size rounds up to.
    top = min(pt.sample_top, max(vocabulary.vocab_size - config.vocabulary.extra_ids, pt.length + 4))
    return library_config(PromptTuningConfig, pt, key, tokens=tokens, sample_top=top)


def check_data(config: schema.Config, tasks: Mapping[str, Any]) -> None:
    """Sequence lengths against every task's output features and preprocessors.

    `tasks`: name -> Task of the data task (or mixture) and of the evaluation task."""
    lengths = config.data.sequence_length
    needed = config_base.model_family(config.model.kind).features
    for name in needed:
        if name not in lengths:
            raise ConfigError(
                f"data.sequence_length.{name}",
                f"missing: a {config.model.kind} model needs lengths for {', '.join(needed)}; "
                f"given: {', '.join(sorted(lengths)) or 'none'}",
            )
    for task in tasks.values():
        for feature_name, feature in task.output_features.items():
            if feature_name not in needed:
                continue
            length = lengths[feature_name]
            least = 2 if feature.add_eos else 1
            if length < least:
                raise ConfigError(
                    f"data.sequence_length.{feature_name}",
                    f"{length} cannot hold one token{' and EOS' if feature.add_eos else ''} "
                    f"of task {task.name!r}; it must be >= {least}",
                )
        for fn in task.preprocessors:
            # Each preprocessor states its own length rule (a `Preprocessor`; plain functions
            # are wrapped, partials keep their bound arguments).

            problem = as_preprocessor(fn).check_sequence_length(lengths)
            if problem:
                raise ConfigError("data.sequence_length", f"task {task.name!r}: {problem}")


def check_batch_size(
    key: str,
    batch: int,
    shards: int,
    mesh: Mapping[str, int],
    process_count: int = 1,
    parts: int | None = None,
    microbatches: int = 1,
) -> None:
    """`ConfigError` naming `key` unless a global batch of `batch` rows splits evenly: over the
    `parts` devices the batch dimension is sharded over (a training batch; None for eval and
    infer, whose batches `ShardedBatches` pads to the devices), over the `shards` data-parallel
    host shards (`DataLayout.num_shards`; hosts of one replica share a block), and, with
    `microbatches` > 1, into that many microbatches over the `parts` devices."""
    layout = f"mesh {dict(mesh)} on {process_count} process(es)"
    if parts is not None and batch % parts:
        raise ConfigError(
            key, f"{batch} does not divide over the {parts} data-parallel shards of {layout}; use a multiple of {parts}"
        )
    if batch < 1 or batch % shards:
        raise ConfigError(
            key, f"{batch} does not divide over the {shards} host data shards of {layout}; use a multiple of {shards}"
        )
    if microbatches > 1 and batch % ((parts or 1) * microbatches):
        raise ConfigError(
            "trainer.num_microbatches",
            f"{microbatches} microbatches of a {batch}-row batch over "
            f"{parts} data-parallel shards of {layout} do not divide evenly",
        )


# -- the mesh: resolved against the devices (a mesh that fits suggested when it does not), and
# the expert axis against the number of experts


def mesh_shapes(device_count: int) -> list[dict[str, int]]:
    """Every (data, fsdp, model) shape whose product is `device_count`."""
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    shapes = [
        {"data": d, "fsdp": f, "model": device_count // (d * f)}
        for d, f in itertools.product(divisors, divisors)
        if device_count % (d * f) == 0
    ]
    return sorted(shapes, key=lambda s: (-s["data"], -s["fsdp"]))


def suggest_mesh(mesh: Mapping[str, int], device_count: int) -> dict[str, int]:
    """A mesh for `device_count` devices close to `mesh`: its model, expert and fsdp sizes cut to
    what divides the devices, data parallelism for the rest (the expert axis named only when
    it is larger than 1)."""

    model = math.gcd(max(1, int(mesh.get("model", 1))), device_count)
    expert = math.gcd(max(1, int(mesh.get("expert", 1))), device_count // model)
    fsdp = math.gcd(max(1, int(mesh.get("fsdp", 1))), device_count // (model * expert))
    data = device_count // (model * expert * fsdp)
    return (
        {"data": data, "fsdp": fsdp, "expert": expert, "model": model}
        if expert > 1
        else {"data": data, "fsdp": fsdp, "model": model}
    )


def resolve_mesh(mesh: Mapping[str, int], device_count: int, process_count: int = 1) -> dict[str, int]:
    """The mesh with its -1 axis filled in by `cairn.partitioning`'s own resolution (the one
    `create_mesh` uses); `ConfigError` naming the mesh, the process and device counts and a mesh
    that fits when it does not fit the devices. An expert axis of size 1 is left out (the
    partitioning rules count a missing expert axis as size 1): a dense run's mesh is
    `{data, fsdp, model}` as before the axis existed."""
    from cairn.partitioning.mesh import DEFAULT_AXES, EXPERT, MeshShapeError, resolve_axes

    axes = {a: int(mesh.get(a, 1)) for a in DEFAULT_AXES}
    if axes[EXPERT] == 1:
        del axes[EXPERT]
    try:
        resolved = resolve_axes(axes, device_count)
        if resolved.get(EXPERT) == 1:  # -1 that left one device
            del resolved[EXPERT]
        return resolved
    except MeshShapeError as e:
        per = device_count // max(1, process_count)
        fits = suggest_mesh({a: s for a, s in axes.items() if s != -1}, device_count)
        raise ConfigError(
            "partitioning.mesh", f"{e} ({process_count} process(es) x {per} device(s)); a mesh that fits: {fits}"
        ) from None


def check_expert_axis(mesh: Mapping[str, int], net: Any) -> None:
    """`ConfigError` naming `model.moe.num_experts` when the mesh's expert axis (resolved, or a
    fixed size) does not divide the experts of `net` (the model config, or a function returning it,
    called only when the expert axis is larger than 1). A dense
    model may use the axis (more data parallelism)."""
    size = int(mesh.get("expert", 1))
    if size <= 1:
        return
    moe = getattr(net() if callable(net) else net, "moe", None)
    experts = moe.num_experts if moe is not None else 0
    if experts and experts % size:
        raise ConfigError(
            "model.moe.num_experts",
            f"{experts} experts do not divide over partitioning.mesh.expert={size}: use a multiple of {size} "
            f"experts, or an expert axis that divides {experts}",
        )
