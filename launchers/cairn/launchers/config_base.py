"""The config schema every experiment starts from, and the few helpers experiments share.

An experiment file (`launchers/configs/<exp>.py`) defines `get_config(arg=None)` returning
`base_config()` with some values changed. Every key an experiment or a `--config.a.b=v`
override may set is here, with its default and type; anything else is an error
(`validation.validate`). Three sections are free-form mappings, checked on their own:
`model.overrides` (fields of the preset's config, `T5Config` / `DecoderOnlyConfig`),
`data.sequence_length` (task feature -> length) and `partitioning.mesh` (axis -> size).
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections
from ml_collections import config_dict

FREE_FORM = ("model.overrides", "data.sequence_length", "partitioning.mesh")

VOCABULARY_KINDS = ("sentencepiece", "byte")
OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("factor", "cosine", "linear", "constant")
LOSS_NORMALIZING_FACTORS = ("NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE",
                            "none")
DECODE_METHODS = ("greedy", "sample", "beam")
MESH_AXES = ("data", "fsdp", "model")


def model_kinds() -> tuple[str, ...]:
    """The allowed `model.kind` values: the `cairn.models` model families (imported on first use,
    so that experiment files stay light)."""
    from cairn.models import families

    return families.names()


def model_family(kind: str) -> Any:
    """The `cairn.models.ModelFamily` of a `model.kind` value (`ConfigError` naming `model.kind`
    and the known kinds when there is none)."""
    from cairn.models import UnknownFamilyError, get_family
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
    """Every key with its default. Paths may be relative (to the directory `bazel run` was
    started in, or the current one); empty paths take the defaults named below."""
    c = ml_collections.ConfigDict()
    c.experiment = "experiment"      # a name; the default model_dir is ~/.cache/cairn/runs/<experiment>
    c.model_dir = ""                 # where checkpoints, TensorBoard logs and config.json go
    c.seed = 0                       # init, dropout and the data order
    c.num_train_steps = 1000
    c.fingerprint_every = 10         # steps between run-fingerprint checksums (0: off)

    c.model = ml_collections.ConfigDict()
    c.model.kind = "encoder_decoder"     # one of MODEL_KINDS
    c.model.preset = "t5_1_1_tiny"       # a cairn.models preset
    c.model.overrides = ml_collections.ConfigDict()  # preset fields, e.g. dropout_rate=0.0
    c.model.vocab_size = 0               # 0: the vocabulary's size rounded up to a multiple of 128
    c.model.label_smoothing = 0.0
    c.model.z_loss = 1e-4
    c.model.loss_normalizing_factor = "NUM_REAL_TARGET_TOKENS"  # per-token loss; or LOSS_NORMALIZING_FACTORS

    c.vocabulary = ml_collections.ConfigDict()
    c.vocabulary.kind = "sentencepiece"  # or "byte" (ByT5)
    c.vocabulary.path = ""               # the SentencePiece .model
    c.vocabulary.extra_ids = 100         # T5 sentinels <extra_id_0>... at the top of the ids

    c.data = ml_collections.ConfigDict()
    c.data.task = ""                     # a registered task or mixture
    c.data.task_modules = ()             # modules imported first; `register_tasks(vocabulary)` is called if defined
    c.data.split = "train"
    c.data.sequence_length = ml_collections.ConfigDict({"inputs": 512, "targets": 114})
    c.data.batch_size = 128              # global batch (all hosts)
    c.data.pack = False
    c.data.cache_dir = ""                # default ~/.cache/cairn/tasks
    c.data.check_source_files = True     # compare the source files' relative names and sizes with the cache's record (no hashing: //launchers:verify_cache hashes)
    c.data.cache_with_beam = False       # cache_tasks main: Apache Beam instead of in-process

    c.partitioning = ml_collections.ConfigDict()
    c.partitioning.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})
    c.partitioning.fsdp_rules = False    # shard params' embed dim over `fsdp` (and batch over data x fsdp)
    c.partitioning.num_slices = 1        # TPU slices (multislice, DCN between them) or groups of hosts
    # How many slices each mesh axis spans (-1: the rest); the default puts data parallelism
    # across slices. Each partitioning.mesh size must be a multiple of its dcn_mesh size.
    c.partitioning.dcn_mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adafactor"       # or "adamw"
    c.optimizer.schedule = "factor"      # factor (t5x), cosine, linear, constant
    c.optimizer.learning_rate = 1.0      # factor: base_learning_rate; else the peak
    c.optimizer.factors = "constant * linear_warmup * rsqrt_decay"
    c.optimizer.warmup_steps = 1000
    c.optimizer.final_learning_rate = 0.0
    c.optimizer.clip_grad_norm = config_dict.placeholder(float)
    c.optimizer.weight_decay = 0.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999

    c.trainer = ml_collections.ConfigDict()
    c.trainer.num_microbatches = 1
    c.trainer.checkpoint_every = 1000
    c.trainer.keep_checkpoints = 3
    c.trainer.eval_every = 0             # 0: only the final evaluation
    c.trainer.log_every = 100
    c.trainer.tensorboard = True

    c.eval = ml_collections.ConfigDict()
    c.eval.task = ""                     # default: data.task
    c.eval.split = "validation"
    c.eval.num_examples = 64
    c.eval.batch_size = 16

    c.post_training = ml_collections.ConfigDict()
    c.post_training.final_eval = True
    c.post_training.num_samples = 4      # examples printed with the model's predictions
    c.post_training.prompts = ()         # decoder-only: texts to continue
    c.post_training.decode_method = "greedy"
    c.post_training.max_decode_length = 0  # 0: the targets length
    c.post_training.temperature = 1.0
    c.post_training.top_k = 0

    c.init = ml_collections.ConfigDict()
    c.init.checkpoint = ""               # a cairn checkpoint's params (restore_params) to start from
    c.init.checkpoint_step = config_dict.placeholder(int)
    c.init.hf_checkpoint = ""            # a Hugging Face T5 directory (config.json + model.safetensors)

    c.multihost = ml_collections.ConfigDict()
    c.multihost.coordinator_address = ""  # host:port of process 0 (or $CAIRN_COORDINATOR_ADDRESS)
    c.multihost.coordinator_bind_address = ""
    c.multihost.num_processes = config_dict.placeholder(int)   # or $CAIRN_NUM_PROCESSES / SLURM_NTASKS
    c.multihost.process_id = config_dict.placeholder(int)      # or $CAIRN_PROCESS_ID / SLURM_PROCID
    c.multihost.initialization_timeout_seconds = 300  # exit 2 if the job is not joined by then
    # A process that stops responding this long (killed, host lost) stops the others: one line
    # naming it, exit status 3 (cairn.partitioning.peer_watchdog). 0: JAX's default (SIGABRT).
    c.multihost.heartbeat_timeout_seconds = 100
    return c


def repo_path(config_file: str, *parts: str) -> str:
    """A path next to the experiment files: `repo_path(__file__, "..", "data", "x.model")`."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_file)), *parts))


def shakespeare(config: ml_collections.ConfigDict, config_file: str, task: str) -> None:
    """Points `config` at a Shakespeare task and the committed SentencePiece vocabulary."""
    config.vocabulary.path = repo_path(config_file, "..", "data", "shakespeare.model")
    config.vocabulary.extra_ids = 100
    config.data.task = task
    config.data.task_modules = ("cairn.launchers.tasks.shakespeare",)


def tiny_run(config: ml_collections.ConfigDict, steps: int, learning_rate: float) -> None:
    """Settings of a few-minute CPU run: AdamW, a cosine schedule with a short warmup,
    frequent logs, checkpoints at the middle and the end. Warmup and checkpoint interval
    follow `num_train_steps` (field references), so `--config.num_train_steps=N` keeps them
    consistent."""
    config.num_train_steps = steps
    steps_ref = config.get_ref("num_train_steps")
    config.optimizer.name = "adamw"
    config.optimizer.schedule = "cosine"
    config.optimizer.learning_rate = learning_rate
    config.optimizer.warmup_steps = steps_ref // 20
    config.optimizer.final_learning_rate = learning_rate / 10
    config.optimizer.clip_grad_norm = 1.0
    config.trainer.log_every = 5
    config.trainer.checkpoint_every = steps_ref // 2 + 1
    config.trainer.eval_every = 0


def pretrain(config: ml_collections.ConfigDict, preset: str, kind: str, task: str,
             lengths: dict, batch_size: int, steps: int) -> None:
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
