"""The config schema: every key of an experiment config declared once (docs/design.md §8).

Each section is a dataclass whose fields are the section's keys; a field's annotation is the
key's type (`X | None`: the default is None, a placeholder of type X), and its metadata
(`knob(...)`) holds the default, a one-line help string and what values are allowed: `choices`
(a tuple, or a `library(...)` reference read from the library that owns the list when the config
is checked), `min` (a lower bound; with `or_minus_one` -1 is allowed too, "the rest"), and for
mappings `keys` (allowed keys) and `free_form` (an experiment file may add keys). The keys of the
sections in `run_spec.LIBRARY_SECTIONS` (`trainer`, `optimizer`, `model.moe`, `post_training`)
feed the fields of the same name of that section's library dataclass; `owner` names the library
field any other key feeds (`module:Class.field`). tests/launchers/schema_test.py checks that
each such default is the library's (the defaults are written here: no JAX import).

`config_base.base_config()` is generated from `Config`; `validation.check_schema` walks it;
`typed(plain)` holds a checked config's values in these (frozen) dataclasses; `describe()`
lists the keys with their help. This module imports no JAX, Flax or TensorFlow
(experiment files import it through `config_base`): library-owned lists load on first use.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Union

import ml_collections
from ml_collections import config_dict

from cairn.launchers.schema_fields import Choices, knob, library, section

MODEL_KINDS = library("cairn.models.families", "names")
MESH_AXES = library("cairn.partitioning.mesh", "DEFAULT_AXES")
DTYPES = library("cairn.models.transformer_config", "DTYPES", extra=("preset",))
MATMUL_PRECISIONS = library("cairn.models.transformer_config", "MATMUL_PRECISIONS", extra=("preset",))


@dataclasses.dataclass(frozen=True)
class Moe:
    num_experts: int = knob(
        0, "routed experts per MoE MLP (0: the preset's MLPs, dense in every preset); a multiple of mesh.expert", min=0
    )
    top_k: int = knob(2, "token_choice: experts each token is sent to", min=1)
    routing: str = knob(
        "token_choice",
        "token_choice (tokens pick experts) or expert_choice (experts pick tokens)",
        choices=library("cairn.models.moe_config", "ROUTINGS"),
    )
    capacity_factor: float = knob(
        1.25, "each expert takes ceil(factor * tokens * top_k / experts) of a row's tokens (> 0)"
    )
    dropless: bool = knob(False, "buffers for every token: nothing dropped")
    every: int = knob(1, "every n-th layer's MLP is routed (n > 1 needs scan_layers off)", min=1)
    expert_mlp_dim: int | None = knob(None, "each expert's hidden size (None: the model's mlp_dim)")
    renormalize: bool = knob(True, "token_choice: the top_k weights rescaled to sum to 1")
    jitter_noise: float = knob(0.0, "training: router input times uniform noise in [1 - j, 1 + j]", min=0)
    load_balance_loss_weight: float = knob(0.01, "Switch's load-balancing loss in the training loss", min=0)
    router_z_loss_weight: float = knob(0.001, "ST-MoE's router z-loss in the training loss", min=0)


# The `model.lora` section: `LoraConfig`'s fields as launcher keys (rank None: no LoRA).
@dataclasses.dataclass(frozen=True)
class Lora:
    rank: int | None = knob(
        None, "LoRA: train rank-r adapters of the targeted kernels; the init.* checkpoint is the frozen base "
        "(None: off)", min=1,
    )  # fmt: skip
    alpha: float = knob(16.0, "LoRA: the adapters' update is scaled by alpha / rank (> 0)")
    dropout: float = knob(0.0, "LoRA: drop rows of each adapter's A with this probability each step, in [0, 1)",
                          min=0)  # fmt: skip
    targets: tuple[str, ...] = knob(
        (r"attention/(query|key|value|out)(/kernel)?$", r"mlp/(wi|wi_\d+|wo)(/kernel)?$"),
        "LoRA: param-path regexes of the adapted kernels (as optimizer.freeze; default attention q/k/v/o and the "
        "MLP, experts included)",
    )  # fmt: skip


# The `model.prompt_tuning` section: `PromptTuningConfig`'s fields as launcher keys, and `text`
# (length None: no prompt tuning).
@dataclasses.dataclass(frozen=True)
class PromptTuning:
    length: int | None = knob(
        None, "prompt tuning: train a prompt of this many embeddings in front of the encoder (T5) or decoder "
        "input; the init.* checkpoint is the frozen base (None: off)", min=1,
    )  # fmt: skip
    init: str = knob(
        "vocab_sample",
        "the prompt's start: vocab_sample (embeddings of seeded frequent ids), tokens (of tokens or text), "
        "random_uniform",
        choices=library("cairn.models.prompt_tuning", "INITS"),
    )
    tokens: tuple[int, ...] = knob((), "init=tokens: token ids whose embeddings start the prompt (the rest sampled)")
    text: str = knob("", "init=tokens: a text tokenized with the run's vocabulary, in place of tokens")
    sample_top: int = knob(5000, "vocab_sample: ids are drawn from the first sample_top (the most frequent)", min=4)
    uniform_scale: float = knob(0.5, "random_uniform: values in [-scale, scale] (> 0)")


@dataclasses.dataclass(frozen=True)
class Model:
    kind: str = knob("encoder_decoder", "a cairn.models model family", choices=MODEL_KINDS)
    preset: str = knob("t5_1_1_tiny", "a cairn.models preset of that family")
    overrides: dict[str, Any] = knob(
        {}, "preset fields to change, e.g. dropout_rate=0.0 (checked against the preset's config)", free_form=True
    )
    vocab_size: int = knob(0, "0: the vocabulary's size rounded up to a multiple of 128", min=0)
    dtype: str = knob("preset", "compute dtype, any family (preset: the preset's or checkpoint's)", choices=DTYPES)
    param_dtype: str = knob("preset", "parameter dtype, any family (preset: the preset's)", choices=DTYPES)
    matmul_precision: str = knob(
        "preset",
        "the attention projections' and dense MLPs' matmuls, any family: default (in dtype) or fp8 (e4m3, "
        "e5m2 gradients, delayed scaling; fp8 GEMMs on Hopper GPUs, emulated elsewhere; preset: the preset's)",
        choices=MATMUL_PRECISIONS,
    )
    label_smoothing: float = knob(0.0, "label smoothing of the cross-entropy loss")
    z_loss: float = knob(1e-4, "auxiliary z-loss coefficient (log of the softmax normalizer squared)")
    loss_normalizing_factor: str = knob(
        "NUM_REAL_TARGET_TOKENS",
        "how the summed loss is normalized ('none': a sum, as t5x's constant factor)",
        choices=library("cairn.models.losses", "NORMALIZING_MODES", extra=("none",)),
    )
    moe: Moe = section(Moe, "mixture of experts: routed MLPs (num_experts > 0), any family")
    lora: Lora = section(Lora, "LoRA adapters (rank set): only they train, against the frozen init.* base")
    prompt_tuning: PromptTuning = section(
        PromptTuning, "prompt tuning (length set): only a prompt trains, against the frozen init.* base"
    )


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    kind: str = knob(
        "sentencepiece",
        "sentencepiece (a .model file), tokenizer_json (a Hugging Face tokenizer.json) or byte (ByT5)",
        choices=("sentencepiece", "tokenizer_json", "byte"),
    )
    path: str = knob("", "the SentencePiece .model or the tokenizer.json")
    extra_ids: int = knob(100, "T5 sentinels <extra_id_0>... at the top of the ids", min=0)


# The `data.source` section: a task from table files, no Python (tasks/from_config.py).
@dataclasses.dataclass(frozen=True)
class Source:
    format: str = knob(
        "", "a task from files, no Python: parquet, arrow, hf (a datasets save_to_disk folder), csv or tsv; "
        "data.task names it ('': data.task_modules register data.task)",
        choices=("", "parquet", "arrow", "hf", "csv", "tsv"),
    )  # fmt: skip
    files: dict[str, str] = knob({}, "split -> file pattern, local or gs:// (hf: the folder)", free_form=True)
    splits: dict[str, str] = knob(
        {}, "the task's split -> a split of files, maybe sliced, e.g. validation: train[90%:] ({}: as files)",
        free_form=True,
    )  # fmt: skip
    columns: dict[str, str] = knob(
        {},
        "feature -> column: inputs and targets (text_to_text), targets (lm, span_corruption, prefix_lm)",
        free_form=True,
    )
    recipe: str = knob(
        "text_to_text",
        "text_to_text (inputs -> targets), lm (running text), span_corruption (T5 denoising of a text column), "
        "prefix_lm (a text column's prefix -> the rest)",
        choices=library("cairn.launchers.tasks.from_config", "RECIPES"),
    )


@dataclasses.dataclass(frozen=True)
class Data:
    task: str = knob("", "a registered task or mixture")
    task_modules: tuple[str, ...] = knob(
        (), "modules imported first; their register_tasks(vocabulary) is called if defined"
    )
    split: str = knob("train", "the training split")
    sequence_length: dict[str, int] = knob({"inputs": 512, "targets": 114}, "task feature -> length", free_form=True)
    batch_size: int = knob(128, "the global batch (all hosts)", min=1)
    pack: bool = knob(False, "pack several examples into each row")
    cache_dir: str = knob("", "where task caches live (default ~/.cache/cairn/tasks)")
    check_source_files: bool = knob(
        True, "compare the source files' names and sizes with the cache's record (//launchers:verify_cache hashes them)"
    )
    cache_with_beam: bool = knob(False, "cache_tasks: Apache Beam instead of in-process")
    source: Source = section(Source, "a task from table files and a recipe, named data.task (no task module)")


@dataclasses.dataclass(frozen=True)
class Partitioning:
    mesh: dict[str, int] = knob(
        {"data": -1, "fsdp": 1, "expert": 1, "model": 1},
        "mesh axis -> size (data, fsdp, expert, model); one size may be -1 (the rest of the devices); "
        "expert: experts over it, the batch over data x expert",
        keys=MESH_AXES,
        free_form=True,
        min=1,
        or_minus_one=True,
        owner="cairn.partitioning.mesh:DEFAULT_AXES",
    )
    fsdp_rules: bool = knob(False, "shard params' embed dim over fsdp (and the batch over data x fsdp)")
    num_slices: int = knob(1, "TPU slices (multislice, DCN between them) or groups of hosts", min=1)
    dcn_mesh: dict[str, int] = knob(
        {"data": -1, "fsdp": 1, "model": 1},
        "how many slices each mesh axis spans (-1: the rest); each mesh size must be a multiple of it",
        keys=MESH_AXES,
        min=1,
        or_minus_one=True,
    )


@dataclasses.dataclass(frozen=True)
class Optimizer:
    name: str = knob("adafactor", "the optimizer", choices=library("cairn.trainer.optimizers", "OPTIMIZERS"))
    schedule: str = knob(
        "factor",
        "learning-rate schedule: factor (t5x's factors string), cosine, linear, constant",
        choices=("factor", "cosine", "linear", "constant"),
    )
    learning_rate: float = knob(1.0, "factor: base_learning_rate; else the peak")
    factors: str = knob("constant * linear_warmup * rsqrt_decay", "t5x factors of the factor schedule")
    warmup_steps: int = knob(1000, "linear warmup steps", min=0)
    final_learning_rate: float = knob(0.0, "cosine / linear: the learning rate at the last step")
    clip_grad_norm: float | None = knob(None, "clip the global gradient norm (None: off)")
    weight_decay: float = knob(0.0, "decoupled weight decay")
    b1: float = knob(0.9, "AdamW beta1")
    b2: float = knob(0.999, "AdamW beta2")
    # Adafactor (t5x's semantics), the weight-decay mask, freezing and groups: optimizer_setup.py.
    factoring: str = knob(
        "heuristic", "adafactor: factor the two largest dims (heuristic) or by logical axis names (logical, t5x)",
        choices=library("cairn.trainer.optimizers", "FACTORINGS"),
    )  # fmt: skip
    factor_rules: dict[str, str] = knob(
        {}, "logical factoring: axis -> row, column, batch or none, over t5x's rules (layers, heads: batch)",
        free_form=True,
    )  # fmt: skip
    factored: bool = knob(True, "adafactor: factored second moments")
    min_dim_size_to_factor: int = knob(128, "adafactor: factor 2-D params with both dims this large", min=1)
    multiply_by_parameter_scale: bool = knob(True, "adafactor: scale updates by the param's RMS (floor 1e-3)")
    decay_rate: float = knob(0.8, "adafactor: beta2 = 1 - (step+1)^-decay_rate", min=0)
    clipping_threshold: float | None = knob(1.0, "adafactor: clip each update's RMS to this (None: off)")
    no_decay: tuple[str, ...] = knob((r"(^|/)(scale|bias|embedding)$",), "param-path regexes without weight decay "
                                     "(default: norm scales, biases, embeddings)")  # fmt: skip
    freeze: tuple[str, ...] = knob((), "param-path regexes never updated, e.g. '^encoder/'")
    groups: tuple[str, ...] = knob((), "'regex=scale': matching params get their own optimizer at learning_rate * "
                                   "scale (first match wins)")  # fmt: skip


_TRAINER = "cairn.trainer:TrainerConfig."


@dataclasses.dataclass(frozen=True)
class Trainer:
    num_microbatches: int = knob(1, "gradient accumulation: microbatches per step", min=1)
    checkpoint_every: int = knob(1000, "steps between checkpoints (0: the final one only)", min=0)
    keep_checkpoints: int = knob(
        3, "latest checkpoints kept (0: all)", min=0, owner="cairn.trainer:CheckpointConfig.keep"
    )
    eval_every: int = knob(0, "steps between evaluations (0: only the final evaluation)", min=0)
    log_every: int = knob(100, "steps between metric logs", min=0)
    tensorboard: bool = knob(True, "write TensorBoard event files")
    peak_flops: float | None = knob(
        None, "the devices' total peak FLOP/s for MFU (default: the published peak of TPUs and GPUs; none on CPU)"
    )
    offload_optimizer_state: bool = knob(False, "the optimizer state in host memory between steps")
    offload_params: bool = knob(
        False, "the float32 masters of the kernels in host memory, their compute-dtype copy on the device"
    )
    compiler_options: dict[str, Any] = knob(
        {},
        "XLA flags for the train step's compile, e.g. xla_tpu_scheduler_percent_shared_memory_limit=50 (with "
        "offloaded state on TPU: the scheduler otherwise fills the chip with early host transfers)",
        free_form=True,
    )


@dataclasses.dataclass(frozen=True)
class Eval:
    task: str = knob("", "the evaluation task (default: data.task)")
    split: str = knob("validation", "the evaluation split")
    num_examples: int = knob(64, "examples evaluated (0: all)", min=0)
    batch_size: int = knob(16, "the global evaluation batch", min=1)
    decode_metrics: bool = knob(
        False, "train: also decode at each eval step for the tasks' prediction metrics (BLEU, accuracy, ...)"
    )


_DECODE = "cairn.models.model_base:DecodeOptions."
LONG_INPUTS = ("truncate", "refuse")  # post_training.long_inputs (`cairn.launchers.prompt_limit`)


@dataclasses.dataclass(frozen=True)
class PostTraining:
    final_eval: bool = knob(True, "evaluate after the last step")
    num_samples: int = knob(4, "examples printed with the model's predictions", min=0)
    prompts: tuple[str, ...] = knob((), "decoder-only: texts to continue")
    decode_method: str = knob(
        "greedy",
        "how predictions are decoded",
        choices=library("cairn.models.model_base", "DECODE_METHODS"),
        owner=_DECODE + "method",
    )
    max_decode_length: int = knob(
        0, "tokens each prediction may have, after its own prompt (0: the targets length)", min=0
    )
    temperature: float = knob(1.0, "sampling temperature (0: greedy)", min=0)
    top_k: int = knob(0, "sampling: keep the k most likely tokens (0: all)", min=0)
    top_p: float = knob(
        1.0, "sampling: keep the smallest set of tokens whose probability reaches p, in (0, 1] (1: all)"
    )
    num_beams: int = knob(4, "beam: the beam width", min=1)
    alpha: float = knob(0.6, "beam: t5x's brevity penalty ((5 + length) / 6) ** alpha divides a beam's log-prob", min=0)
    num_decodes: int = knob(
        1,
        "sample: samples drawn per prompt, the highest-scoring returned; beam: <= num_beams (the best returned)",
        min=1,
    )
    max_input_length: int = knob(0, "prompt tokens at most (0: data.sequence_length.inputs, else .targets)", min=0)
    long_inputs: str = knob(
        "truncate",
        "a longer prompt: truncate (decoder-only: keep its end; encoder input: its start, then EOS) or refuse",
        choices=LONG_INPUTS,
    )


@dataclasses.dataclass(frozen=True)
class Logging:
    wandb: str = knob("", "a Weights & Biases project to log to, offline ('': off)", owner=_TRAINER + "wandb")


@dataclasses.dataclass(frozen=True)
class Init:
    checkpoint: str = knob("", "a cairn checkpoint whose params the run starts from")
    checkpoint_step: int | None = knob(None, "its step (None: the latest)")
    hf_checkpoint: str = knob("", "a Hugging Face T5 or Llama directory (config.json + safetensors)")
    t5x_checkpoint: str = knob(
        "", "a t5x checkpoint (checkpoint_<step> or its run folder; T5 families, the preset's shape)"
    )
    upcycle_from: str = knob(
        "", "a dense cairn checkpoint: its params seed this model.overrides.moe model (sparse upcycling)"
    )


@dataclasses.dataclass(frozen=True)
class Multihost:
    coordinator_address: str = knob("", "host:port of process 0 (or $CAIRN_COORDINATOR_ADDRESS)")
    coordinator_bind_address: str = knob("", "the address process 0 binds (default: coordinator_address)")
    num_processes: int | None = knob(None, "processes in the job (or $CAIRN_NUM_PROCESSES / SLURM_NTASKS)")
    process_id: int | None = knob(None, "this process (or $CAIRN_PROCESS_ID / SLURM_PROCID)")
    initialization_timeout_seconds: int = knob(300, "exit 2 if the job is not joined by then", min=1)
    heartbeat_timeout_seconds: int = knob(
        20, "a peer silent this long stops the others, exit 3 (0: JAX's default, SIGABRT)", min=0
    )


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole config: top-level keys, then the sections."""

    experiment: str = knob("experiment", "a name; the default model_dir is runs/<experiment>")
    model_dir: str = knob("", "checkpoints, logs and config.json (default: runs/<experiment> where run)")
    seed: int = knob(0, "init, dropout and the data order", owner=_TRAINER + "seed")
    num_train_steps: int = knob(1000, "training steps", min=1)
    fingerprint_every: int = knob(10, "steps between run-fingerprint checksums (0: off)", min=0)
    model: Model = section(Model, "the network: family, preset, loss")
    vocabulary: Vocabulary = section(Vocabulary, "the tokenizer")
    data: Data = section(Data, "the training task and its batches")
    partitioning: Partitioning = section(Partitioning, "the device mesh and slices")
    optimizer: Optimizer = section(Optimizer, "optimizer and learning-rate schedule")
    trainer: Trainer = section(Trainer, "the training loop")
    eval: Eval = section(Eval, "evaluation")
    post_training: PostTraining = section(PostTraining, "what runs after training")
    logging: Logging = section(Logging, "where metrics go besides metrics.jsonl and TensorBoard")
    init: Init = section(Init, "parameters to start from")
    multihost: Multihost = section(Multihost, "joining a multi-process job")


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: its dotted `path`, Python `type` (None allowed when `optional`), `item` type
    of a tuple's or mapping's values, and the field's metadata."""

    path: str
    type: Any
    optional: bool
    item: Any
    default: Any
    help: str
    choices: Choices | None = None
    min: float | None = None
    or_minus_one: bool = False
    keys: Choices | None = None
    free_form: bool = False
    owner: str = ""

    def allowed(self) -> tuple[str, ...] | None:
        """The allowed values (library-owned lists loaded now), or None when any value of the type is."""
        return _resolve(self.choices)

    def allowed_keys(self) -> tuple[str, ...] | None:
        """A mapping's allowed keys, or None when any key is."""
        return _resolve(self.keys)


def _resolve(choices: Choices | None) -> tuple[str, ...] | None:
    return choices() if callable(choices) else choices


def _unpack(hint: Any) -> tuple[Any, bool, Any]:
    """`(type, optional, item type)` of an annotation."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return inner[0], True, None
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple, False, args[0]
    if origin is dict:
        return dict, False, args[1]
    return hint, False, None


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def sections(cls: type = Config, prefix: str = "") -> list[str]:
    """The dotted names of the sections (under `prefix`)."""
    out = []
    for f, hint in _fields(cls):
        if "section" in f.metadata:
            out += [prefix + f.name, *sections(hint, f"{prefix}{f.name}.")]
    return out


def keys(cls: type = Config, prefix: str = "") -> list[Key]:
    """Every key of the schema (sections flattened, in declaration order)."""
    out = []
    for f, hint in _fields(cls):
        if "section" in f.metadata:
            out += keys(hint, f"{prefix}{f.name}.")
            continue
        t, optional, item = _unpack(hint)
        meta = {k: v for k, v in f.metadata.items() if k in {x.name for x in dataclasses.fields(Key)}}
        out.append(Key(path=prefix + f.name, type=t, optional=optional, item=item, **meta))
    return out


def key(path: str) -> Key:
    """The `Key` at a dotted path (`KeyError` if there is none)."""
    found = [k for k in keys() if k.path == path]
    if not found:
        raise KeyError(path)
    return found[0]


FREE_FORM: tuple[str, ...] = tuple(k.path for k in keys() if k.free_form)


def typed(plain: Mapping[str, Any], cls: type = Config) -> Any:
    """The schema dataclass `cls` (default `Config`) holding the values of a checked plain config
    (`validation.check_schema`): each section as its dataclass, lists of tuple keys as tuples, a
    key absent from `plain` at its default. Frozen: the typed keys a run reads."""
    values = {}
    for f, hint in _fields(cls):
        if f.name not in plain:
            continue
        value = plain[f.name]
        if "section" in f.metadata:
            value = typed(value, hint)
        elif _unpack(hint)[0] is tuple and isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):  # a mapping key: its own copy, not shared with `plain`
            value = copy.deepcopy(value)
        values[f.name] = value
    return cls(**values)


def base_config() -> ml_collections.ConfigDict:
    """Every key with its default, as a ConfigDict (None defaults are typed placeholders)."""
    return _config_dict(Config)


def _config_dict(cls: type) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    for f, hint in _fields(cls):
        if "section" in f.metadata:
            c[f.name] = _config_dict(hint)
            continue
        t, optional, _ = _unpack(hint)
        default = f.metadata["default"]
        if default is None:
            c[f.name] = config_dict.placeholder(t)
        elif isinstance(default, dict):
            c[f.name] = ml_collections.ConfigDict(copy.deepcopy(default))
        else:
            c[f.name] = default
    return c


def type_name(t: Any) -> str:
    """How messages and `describe` name a type."""
    return {dict: "mapping"}.get(t, getattr(t, "__name__", str(t)))


def _describe_type(k: Key) -> str:
    if k.type is tuple:
        name = f"tuple of {type_name(k.item)}"
    elif k.type is dict:
        name = "mapping" if k.item is Any else f"mapping of {type_name(k.item)}"
    else:
        name = type_name(k.type)
    return f"{name} or None" if k.optional else name


def describe_range(k: Key) -> str:
    """The allowed values or range of `k` in words ('' when any value of its type is allowed)."""
    parts = []
    allowed = k.allowed()
    if allowed is not None:
        parts.append("one of " + ", ".join(allowed))
    if k.keys is not None:
        parts.append("keys " + ", ".join(k.allowed_keys() or ()))
    if k.min is not None:
        parts.append(f">= {k.min:g}" + (" or -1" if k.or_minus_one else ""))
    return "; ".join(parts)


def describe() -> list[tuple[str, str, str, str, str]]:
    """Rows `(key, type, default, allowed values or range, help)` of every key, for `--help`
    texts and docs. Library-owned choices are loaded (this imports `cairn.models`, ...)."""
    return [(k.path, _describe_type(k), repr(k.default), describe_range(k), k.help) for k in keys()]
