"""The config every experiment starts from, and the few helpers experiments share.

An experiment file (`launchers/configs/<exp>.py`) defines `get_config(arg=None)` returning
`base_config()` with some values changed. Every key an experiment or a `--config.a.b=v`
override may set is declared once in `cairn.launchers.schema` (type, default, allowed values,
help); `base_config()` is generated from it and anything else is an error
(`validation.check_schema`). The `FREE_FORM` mappings (`model.overrides`,
`data.sequence_length`, `partitioning.mesh`) may get new keys in an experiment file.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from cairn.launchers import config_io, schema
from cairn.models import UnknownFamilyError, get_family

FREE_FORM = schema.FREE_FORM


def model_kinds() -> tuple[str, ...]:
    """The allowed `model.kind` values: the `cairn.models` model families (imported on first use,
    so that experiment files stay light)."""
    return schema.MODEL_KINDS()


def model_family(kind: str) -> Any:
    """The `cairn.models.ModelFamily` of a `model.kind` value (`ConfigError` naming `model.kind`
    and the known kinds when there is none)."""
    from cairn.launchers.validation import ConfigError

    try:
        return get_family(kind)
    except UnknownFamilyError as e:
        raise ConfigError("model.kind", str(e)) from None


def __getattr__(name: str) -> Any:
    """`MODEL_KINDS` (= `model_kinds()`), derived from the `cairn.models` family registry."""
    if name == "MODEL_KINDS":
        return model_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def base_config() -> ml_collections.ConfigDict:
    """Every key with its default (`schema.base_config()`). Paths may be relative (to the
    directory `bazel run` was started in, or the current one); empty paths take the defaults
    the schema's help names."""
    return schema.base_config()


def repo_path(config_file: str, *parts: str) -> str:
    """A path next to the experiment files: `repo_path(__file__, "..", "data", "x.model")`."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_file)), *parts))


def shakespeare(config: ml_collections.ConfigDict, config_file: str, task: str) -> None:
    """Points `config` at a Shakespeare task and the committed SentencePiece vocabulary (a path
    relative to the user's directory when it lies there, so config.json holds it relative)."""
    config.vocabulary.path = config_io.relative_to_user_dir(repo_path(config_file, "..", "data", "shakespeare.model"))
    config.vocabulary.extra_ids = 100
    config.data.task = task
    config.data.task_modules = ("cairn.launchers.tasks.shakespeare",)


def tiny_run(config: ml_collections.ConfigDict, steps: int, learning_rate: float) -> None:
    """Settings of a few-minute CPU run: AdamW, a cosine schedule with a short warmup,
    frequent logs, checkpoints at the middle and the end. Warmup and checkpoint interval
    follow `num_train_steps`, the final learning rate follows `optimizer.learning_rate` (field
    references), so `--config.num_train_steps=N` or `--config.optimizer.learning_rate=X` keeps
    them consistent."""
    config.num_train_steps = steps
    steps_ref = config.get_ref("num_train_steps")
    config.optimizer.name = "adamw"
    config.optimizer.schedule = "cosine"
    config.optimizer.learning_rate = learning_rate
    config.optimizer.warmup_steps = steps_ref // 20
    config.optimizer.final_learning_rate = config.optimizer.get_ref("learning_rate") / 10
    config.optimizer.clip_grad_norm = 1.0
    config.trainer.log_every = 5
    config.trainer.checkpoint_every = steps_ref // 2 + 1
    config.trainer.eval_every = 0


# The default experiment's model_dir (launchers/configs/shakespeare_t5_tiny.py, run where the
# command runs): the frozen base of the adaptation experiments.
DEFAULT_EXPERIMENT_DIR = "runs/shakespeare_t5_tiny"


def adapt_default_experiment(
    config: ml_collections.ConfigDict, config_file: str, experiment: str, steps: int, learning_rate: float
) -> None:
    """An adaptation experiment (LoRA, prompt tuning) of the default experiment's checkpoint
    (`init.checkpoint` = `DEFAULT_EXPERIMENT_DIR`; another with `--config.init.checkpoint`) on
    Shakespeare line completion: its model (tiny T5.1.1), lengths for lines, a `tiny_run` of
    `steps` at `learning_rate`, the final evaluation and four samples."""
    config.experiment = experiment
    shakespeare(config, config_file, "shakespeare_line_completion")
    # model.kind: the schema's default (the encoder-decoder family, as the default experiment)
    config.model.preset = "t5_1_1_tiny"
    config.init.checkpoint = DEFAULT_EXPERIMENT_DIR
    config.data.sequence_length = {"inputs": 32, "targets": 32}
    config.data.batch_size = 32
    tiny_run(config, steps=steps, learning_rate=learning_rate)
    config.eval.num_examples = 64
    config.post_training.num_samples = 4


def pretrain(
    config: ml_collections.ConfigDict, preset: str, kind: str, task: str, lengths: dict, batch_size: int, steps: int
) -> None:
    """A pretraining run at scale: the preset, a user-registered task, and the model family's
    `pretrain_optimizer` settings (t5x's Adafactor with `rsqrt_decay` and 10k warmup for T5;
    AdamW with a cosine schedule for decoder-only)."""
    config.experiment = f"{preset}_pretrain"
    config.model.kind = kind
    config.model.preset = preset
    config.data.task = task
    config.data.sequence_length = lengths
    config.data.batch_size = batch_size
    config.data.pack = True
    config.num_train_steps = steps
    config.trainer.checkpoint_every = 5000
    config.trainer.log_every = 100
    for key, value in model_family(kind).pretrain_optimizer:
        config.optimizer[key] = value


def model_parallel_mesh(config: ml_collections.ConfigDict, size: str) -> None:
    """Data parallel for the small sizes; 8-way model parallel for xl / xxl (and LM >= 3b)."""
    if size in ("xl", "xxl", "3b", "8b"):
        config.partitioning.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 8})


def bf16_scan_remat(config: ml_collections.ConfigDict, remat_policy: str = "full") -> None:
    """Settings of a large model on a pod: bfloat16 compute (`model.dtype`; parameters stay
    as the preset stores them), layers under `jax.lax.scan` (one compiled layer) and
    rematerialization (`remat_policy`: activations recomputed in the backward pass)."""
    config.model.dtype = "bfloat16"
    config.model.overrides.scan_layers = True
    config.model.overrides.remat_policy = remat_policy
