"""The run spec: an experiment's config resolved once into the typed parts a run is built from.

`load(config)` takes the loaded ml-collections config (paths resolved, `config_io.resolve_paths`)
across the one edge into plain values (`config_io.to_plain`), checks it against the schema, and
resolves it into a frozen `RunSpec` whose sections are the libraries' own dataclasses: the
network config (preset, overrides, `model.*` keys and `model.moe`, vocab size), the
`OptimizerConfig`, the learning-rate schedule, the `TrainerConfig` (with its `CheckpointConfig`),
the `DecodeOptions`, the `LoraConfig` of `model.lora.*` (None without LoRA), the
`PromptTuningConfig` of `model.prompt_tuning.*` (None without prompt tuning), and the launchers'
`ReaderSpec` and `MeshSpec`. Each is built, and so checked, once. `keys` holds every key typed
(`schema.typed`); `plain` and `stored` the config's JSON forms (in checkpoints and the
same-config check; `config.json` and the config hash).

`bind(spec, devices, process_count)` does the checks that need the devices: the mesh resolved
against them, the expert axis against the experts, the batch sizes against the data shards; it
returns the `BoundRun` (mesh and `Partitioner`). Nothing here imports JAX before the schema has
passed (a config refused by it costs no JAX import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ml_collections

from cairn.launchers import config_base, config_io, optimizer_setup, schema, validation
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError

if TYPE_CHECKING:  # the library dataclasses, imported when built (after the schema has passed)
    from cairn.models import DecodeOptions
    from cairn.models.lora import LoraConfig
    from cairn.models.prompt_tuning import PromptTuningConfig
    from cairn.trainer import CheckpointConfig, OptimizerConfig, TrainerConfig


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """`partitioning.*`: mesh axis -> size (one may be -1: the rest of the devices), how many
    slices each axis spans (`dcn`), the slice count and the FSDP rules switch."""

    axes: Mapping[str, int]
    dcn: Mapping[str, int]
    num_slices: int
    fsdp_rules: bool

    @classmethod
    def of(cls, keys: schema.Config) -> MeshSpec:
        p = keys.partitioning
        axes, dcn = ({a: int(s) for a, s in m.items()} for m in (p.mesh, p.dcn_mesh))
        return cls(axes, dcn, p.num_slices, p.fsdp_rules)

    def resolve(self, device_count: int, process_count: int = 1) -> dict[str, int]:
        """The mesh on `device_count` devices (`validation.resolve_mesh`: `ConfigError` when it does
        not fit, naming a mesh that does)."""
        return validation.resolve_mesh(self.axes, device_count, process_count)


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """What the training reader reads (`data.*`, the seed and the run's length): the task or
    mixture, its split and cache, the global batch, the lengths of the model family's features,
    packing and the family's feature converter (a `cairn.datatasks` class name), and `start_id`:
    the token the converter starts each row's decoder inputs with, the one decoding puts in
    front of a prompt (`prompt_start_id`)."""

    task: str
    split: str
    cache_dir: str
    task_modules: tuple[str, ...]
    seed: int
    batch_size: int
    sequence_length: Mapping[str, int]
    pack: bool
    feature_converter: str
    check_source_files: bool
    num_steps: int
    start_id: int

    @classmethod
    def of(cls, keys: schema.Config, model: Any) -> ReaderSpec:
        """`keys`' reader of the network config `model` (its start token)."""
        family = config_base.model_family(keys.model.kind)
        lengths = keys.data.sequence_length  # a missing one: `validation.check_data` names it
        d = keys.data
        return cls(
            task=d.task,
            split=d.split,
            cache_dir=d.cache_dir,
            task_modules=tuple(d.task_modules),
            seed=keys.seed,
            batch_size=d.batch_size,
            sequence_length={k: int(lengths[k]) for k in family.features if k in lengths},
            pack=d.pack,
            feature_converter=family.feature_converter,
            check_source_files=d.check_source_files,
            num_steps=keys.num_train_steps,
            start_id=prompt_start_id(keys, model),
        )


def prompt_start_id(keys: schema.Config, model: Any) -> int:
    """The start token the model's decoder inputs begin with: a decoder-only network config's
    `prompt_start_id` (the preset's with `model.overrides`, or `init.hf_checkpoint`'s
    `bos_token_id`), 0 where it is None (the prompts hold their own) or the family has none (T5's
    decoder start is 0)."""
    if not config_base.model_family(keys.model.kind).continues_prompt:
        return 0
    return getattr(model, "prompt_start_id", 0) or 0


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The resolved config of one run (module docstring). `vocabulary` is the
    `cairn.tokenizers` vocabulary of `vocabulary.*` (the model's vocab size is checked against it)."""

    keys: schema.Config
    plain: Mapping[str, Any]
    stored: Mapping[str, Any]
    vocabulary: Any
    model: Any  # the model family's config class (`T5Config`, `DecoderOnlyConfig`, `LlamaConfig`, ...)
    optimizer: OptimizerConfig
    schedule: Callable
    trainer: TrainerConfig
    checkpoint: CheckpointConfig
    decode: DecodeOptions
    lora: LoraConfig | None
    reader: ReaderSpec
    mesh: MeshSpec
    prompt_tuning: PromptTuningConfig | None = None


@dataclasses.dataclass(frozen=True)
class BoundRun:
    """A spec bound to the devices (`bind`): the resolved mesh (axis -> size) and its `Partitioner`."""

    mesh: Mapping[str, int]
    partitioner: Any


def checked_keys(config: ml_collections.ConfigDict) -> tuple[dict[str, Any], schema.Config]:
    """`(plain, keys)` of a loaded, path-resolved config: its plain form (the config's one
    `to_plain`) checked against the schema (`ConfigError` naming the key), and typed."""
    plain = config_io.to_plain(config)
    validation.check_schema(plain)
    return plain, schema.typed(plain)


def load(config: ml_collections.ConfigDict) -> RunSpec:
    """`resolve` of `checked_keys(config)`: a loaded, path-resolved config's `RunSpec`."""
    plain, keys = checked_keys(config)
    return resolve(plain, keys)


def resolve(plain: Mapping[str, Any], keys: schema.Config) -> RunSpec:
    """The `RunSpec` of a config whose schema passed (`checked_keys`): the model, the paths, the
    vocabulary, LoRA, prompt tuning, the optimizer and schedule checked, each once (`ConfigError` naming the key)."""
    preset = validation.check_model(keys)
    mesh = MeshSpec.of(keys)
    validation.check_expert_axis(mesh.axes, preset)  # a given expert axis (-1: `resolve_mesh` checks it)
    validation.check_paths(keys)
    lora = validation.check_lora(keys)  # its targets against the params: `optimizer_setup.check_param_patterns`
    vocabulary = data_lib.make_vocabulary(keys)
    prompt_tuning = validation.check_prompt_tuning(keys, vocabulary)
    model = network_config(keys, preset, vocabulary)
    reader = ReaderSpec.of(keys, model)
    trainer, checkpoint = trainer_config(keys)
    return RunSpec(
        keys=keys,
        plain=plain,
        stored=config_io.as_given(plain),
        vocabulary=vocabulary,
        model=model,
        optimizer=optimizer_setup.optimizer_config(keys),
        schedule=make_schedule(keys),
        trainer=trainer,
        checkpoint=checkpoint,
        decode=decode_options(keys, reader),
        lora=lora,
        reader=reader,
        mesh=mesh,
        prompt_tuning=prompt_tuning,
    )


def round_up(n: int, multiple: int = 128) -> int:
    return -(-int(n) // multiple) * multiple


def network_config(keys: schema.Config, preset: Any, vocabulary: Any) -> Any:
    """The network config: `preset` (`validation.check_model`'s: the preset with
    `model.overrides`), or the Hugging Face checkpoint's config with them, and the `model.*` keys;
    its vocab size `model.vocab_size` or the vocabulary's rounded up to 128 (a checkpoint's own)."""
    if keys.init.hf_checkpoint:
        hf = config_base.model_family(keys.model.kind).hf
        if hf is None:
            raise ConfigError("init.hf_checkpoint", f"model.kind {keys.model.kind!r} has no Hugging Face import")
        net = validation.apply_model_keys(keys, hf.config_from_dir(keys.init.hf_checkpoint, **keys.model.overrides))
        vocab_size = net.vocab_size
    else:
        net, vocab_size = preset, keys.model.vocab_size or round_up(vocabulary.vocab_size)
    if vocab_size < vocabulary.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"{vocab_size} is smaller than the vocabulary's {vocabulary.vocab_size} ids"
        )
    return dataclasses.replace(net, vocab_size=vocab_size)


def make_schedule(keys: schema.Config) -> Callable:
    """The learning-rate schedule of `optimizer.*` (`ConfigError` naming the key when it cannot be built)."""
    from cairn.trainer import cosine_schedule, factor_schedule, linear_schedule

    opt = keys.optimizer
    if opt.schedule in ("cosine", "linear") and keys.num_train_steps <= opt.warmup_steps:
        raise ConfigError(
            "optimizer.warmup_steps",
            f"{opt.warmup_steps} must be below num_train_steps ({keys.num_train_steps}) for a {opt.schedule} schedule",
        )
    try:
        if opt.schedule == "factor":
            return factor_schedule(opt.factors, base_learning_rate=opt.learning_rate, warmup_steps=opt.warmup_steps)
        if opt.schedule == "constant":
            factors = "constant * linear_warmup" if opt.warmup_steps else "constant"
            return factor_schedule(factors, base_learning_rate=opt.learning_rate, warmup_steps=opt.warmup_steps)
        fn = cosine_schedule if opt.schedule == "cosine" else linear_schedule
        return fn(opt.learning_rate, keys.num_train_steps, opt.warmup_steps, opt.final_learning_rate)
    except ValueError as e:
        raise ConfigError(f"optimizer.{'factors' if opt.schedule == 'factor' else 'schedule'}", str(e)) from None


def loss_normalizing_factor(keys: schema.Config) -> str | None:
    """`model.loss_normalizing_factor` as the models take it (None for 'none')."""
    value = keys.model.loss_normalizing_factor
    return None if value == "none" else value


# Schema sections whose keys feed the fields of the same name of a library dataclass
# (`validation.library_config`): those keys need no `owner=`; schema_test checks their defaults.
LIBRARY_SECTIONS = {
    "trainer": "cairn.trainer:TrainerConfig",
    "optimizer": "cairn.trainer:OptimizerConfig",
    "model.moe": "cairn.models.moe_config:MoeConfig",
    "post_training": "cairn.models:DecodeOptions",
    "model.lora": "cairn.models.lora:LoraConfig",
    "model.prompt_tuning": "cairn.models.prompt_tuning:PromptTuningConfig",
}


def trainer_config(keys: schema.Config) -> tuple[TrainerConfig, CheckpointConfig]:
    """`(TrainerConfig, CheckpointConfig)` of `trainer.*` (its keys named like `TrainerConfig`'s
    fields feed them) and the top-level keys."""
    from cairn.trainer import CheckpointConfig, TrainerConfig

    checkpoint = CheckpointConfig(keep=keys.trainer.keep_checkpoints or None, asynchronous=True)
    trainer = validation.library_config(
        TrainerConfig,
        keys.trainer,
        "trainer",
        model_dir=keys.model_dir,
        num_train_steps=keys.num_train_steps,
        seed=keys.seed,
        microbatch_reduction="sum" if loss_normalizing_factor(keys) is None else "mean",
        checkpoint=checkpoint,
        wandb=keys.logging.wandb,
    )
    return trainer, checkpoint


def decode_options(keys: schema.Config, reader: ReaderSpec) -> DecodeOptions:
    """The `DecodeOptions` of `post_training.*`; its length `max_decode_length`, else the targets
    length (callers that decode another length replace it)."""
    from cairn.models import DecodeOptions

    pt = keys.post_training
    length = pt.max_decode_length or reader.sequence_length.get("targets", 1)
    return validation.library_config(
        DecodeOptions, pt, "post_training", method=pt.decode_method, max_decode_length=length
    )


def bind(
    spec: RunSpec,
    devices: Sequence[Any],
    process_count: int = 1,
    *,
    train: bool = True,
    padded: Sequence[tuple[str, int]] = (),
) -> BoundRun:
    """The checks that need the devices, once: the mesh resolved against them and its expert axis
    against the experts, the `Partitioner` built, and the batch sizes checked: with `train`,
    `data.batch_size` over the data-parallel devices and host shards (`check_train_batch_size`);
    each `(name, rows)` of `padded` (eval's and infer's batches, which `ShardedBatches` pads to
    the data-parallel devices) over the host shards."""
    from cairn.launchers import builder

    mesh = resolve_mesh(spec, len(devices), process_count)
    partitioner = builder.make_partitioner(spec.mesh, mesh, devices, process_count)
    parts, shards = partitioner.batch_parts(), partitioner.data_layout().num_shards
    if train:
        check_train_batch_size(spec, parts, shards, mesh, process_count)
    for name, rows in padded:
        validation.check_batch_size(name, rows, shards, mesh, process_count)
    return BoundRun(mesh, partitioner)


def resolve_mesh(spec: RunSpec, device_count: int, process_count: int = 1) -> dict[str, int]:
    """The spec's mesh on `device_count` devices (`MeshSpec.resolve`) and, when its expert axis
    was -1 (the rest of the devices), that axis against the experts (a given size was checked by
    `resolve`): `ConfigError` naming the key."""
    mesh = spec.mesh.resolve(device_count, process_count)
    if spec.mesh.axes.get("expert") == -1:
        validation.check_expert_axis(mesh, spec.model)
    return mesh


def check_train_batch_size(
    spec: RunSpec, parts: int, shards: int, mesh: Mapping[str, int], process_count: int = 1
) -> None:
    """`validation.check_batch_size` of `data.batch_size` over `parts` data-parallel devices and
    `shards` host shards, in the trainer's microbatches."""
    validation.check_batch_size(
        "data.batch_size",
        spec.reader.batch_size,
        shards,
        mesh,
        process_count,
        parts=parts,
        microbatches=spec.trainer.num_microbatches,
    )
