"""From a validated config to the objects of a run: model, partitioner, data, optimizer,
evaluator, trainer. The train, eval and infer entry points share these functions."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from cairn.launchers import data as data_lib
from cairn.launchers import optimizer_setup, predict_fns
from cairn.launchers.config_base import model_family
from cairn.launchers.config_io import to_plain
from cairn.launchers.lm_evaluator import ContinuationEvaluator
from cairn.launchers.sharded_batches import ShardedBatches
from cairn.launchers.validation import (
    ConfigError,
    apply_model_keys,
    check_expert_axis,
    check_lora,
    check_model,
    resolve_mesh,
)
from cairn.models.t5x_checkpoint import T5xCheckpointError, import_t5x
from cairn.partitioning import MeshShapeError, Partitioner, create_mesh, standard_logical_axis_rules
from cairn.partitioning.mesh import resolve_axes

log = logging.getLogger(__name__)

# Re-exported: the data side of a run.
make_vocabulary = data_lib.make_vocabulary
make_train_data = data_lib.make_train_data


def round_up(n: int, multiple: int = 128) -> int:
    return -(-int(n) // multiple) * multiple


def model_config(config: ml_collections.ConfigDict, vocabulary: Any = None, preset: Any = None) -> Any:
    """The network config: the preset (or the Hugging Face checkpoint's config) with
    `model.overrides`, its vocab size `model.vocab_size` or the vocabulary's rounded up to 128.
    `preset`: `validation.check_model(config)` when the caller has it already."""
    if config.init.hf_checkpoint:
        net = hf_model_config(config.init.hf_checkpoint, to_plain(config.model.overrides), config.model.kind)
        net = apply_model_keys(config, net)
        vocab_size = net.vocab_size
    else:
        net = preset if preset is not None else check_model(config)
        vocabulary = vocabulary if vocabulary is not None else make_vocabulary(config)
        vocab_size = config.model.vocab_size or round_up(vocabulary.vocab_size)
    if vocabulary is not None and vocab_size < vocabulary.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"{vocab_size} is smaller than the vocabulary's {vocabulary.vocab_size} ids"
        )
    return dataclasses.replace(net, vocab_size=vocab_size)


def hf_converter(kind: str) -> Any:
    """The Hugging Face converter of model family `kind` (`ConfigError` naming `init.hf_checkpoint`
    when the family has none)."""
    hf = model_family(kind).hf
    if hf is None:
        raise ConfigError("init.hf_checkpoint", f"model.kind {kind!r} has no Hugging Face import")
    return hf


def hf_model_config(directory: str, overrides: dict, kind: str) -> Any:
    """The network config of a Hugging Face directory (its config.json and the weights file's
    header, not the weights), with overrides, by the converter of model family `kind`."""

    return hf_converter(kind).config_from_dir(directory, **overrides)


def loss_normalizing_factor(config: ml_collections.ConfigDict) -> Any:
    value = config.model.loss_normalizing_factor
    return None if value == "none" else value


def load_model(config: ml_collections.ConfigDict, vocabulary: Any = None, net: Any = None) -> Any:
    """The model family's model (`EncoderDecoderModel`, `DecoderOnlyModel`) of the config (no
    parameters yet). `net`: its `model_config` when the caller has it (`run_setup.prepare`'s)."""
    from cairn.models import flops_per_token

    net = net if net is not None else model_config(config, vocabulary)
    model = model_family(config.model.kind).make_model(
        net,
        label_smoothing=config.model.label_smoothing,
        z_loss=config.model.z_loss,
        loss_normalizing_factor=loss_normalizing_factor(config),
    )
    try:
        model.flops_per_token = flops_per_token(net, data_lib.sequence_length(config))
    except Exception:  # FLOPs are for MFU only
        pass
    return model


def trainable_model(config: ml_collections.ConfigDict, model: Any) -> Any:
    """What the trainer trains: `model`, or with `model.lora.rank` set a
    `cairn.models.lora.LoraModel` over it (its params the adapters, `model`'s the frozen base)."""
    lora = check_lora(config)
    if lora is None:
        return model
    from cairn.models.lora import LoraModel

    trainable = LoraModel(model, lora)
    trainable.flops_per_token = getattr(model, "flops_per_token", None)  # MFU: the forward and backward it runs
    return trainable


def upcycled_params(config: ml_collections.ConfigDict, trainer: Any, abstract: Any) -> Any:
    """The MoE model's params upcycled (`cairn.models.upcycle`) from the dense checkpoint
    `init.upcycle_from` (the same model without `moe`), routers drawn from the run's init key.
    Shapes are checked against the checkpoint's metadata first: `ConfigError` naming the tensor."""
    from cairn.models import UpcycleError, upcycle
    from cairn.trainer import restore_params, stored_params

    moe_config = trainer.model.config
    dense_config = moe_config.replace(moe=None)
    rng = jax.random.fold_in(jax.random.PRNGKey(config.seed), 0)  # the Trainer's init key
    build = lambda dense: upcycle(dense, dense_config, moe_config, rng)
    source, step = config.init.upcycle_from, config.init.checkpoint_step
    try:
        jax.eval_shape(build, stored_params(source, step))
    except UpcycleError as e:
        raise ConfigError("init.upcycle_from", str(e)) from None
    dense_model = model_family(config.model.kind).make_model(dense_config)
    shapes = jax.eval_shape(dense_model.init, rng)
    shardings = trainer.partitioner.shardings_for(dense_model.logical_axes(), shapes)
    dense_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
    dense = restore_params(source, dense_abstract, step=step)
    return jax.jit(build, out_shardings=jax.tree.map(lambda a: a.sharding, abstract))(dense)


def make_partitioner(config: ml_collections.ConfigDict) -> Any:
    """The `Partitioner` over all devices with the config's mesh (checked to fit). With
    `partitioning.num_slices` > 1 the mesh is hybrid: each `partitioning.dcn_mesh` axis spans
    that many slices (DCN), the rest of it stays inside a slice (ICI). `ConfigError` naming the
    key when the slices do not fit the devices."""

    devices = jax.devices()
    mesh = resolve_mesh(to_plain(config.partitioning.mesh), len(devices), jax.process_count())
    num_slices = int(config.partitioning.get("num_slices", 1))
    dcn = {a: int(s) for a, s in to_plain(config.partitioning.get("dcn_mesh", {"data": -1})).items()}
    try:  # its -1 axis: partitioning's own resolution, over slices instead of devices
        dcn = resolve_axes(dcn, num_slices)
    except MeshShapeError as e:
        why = f"does not fit partitioning.num_slices={num_slices}: {e} (slices counted as devices)"
        raise ConfigError("partitioning.dcn_mesh", why) from None
    layout = f"{jax.process_count()} process(es), {len(devices)} devices"
    if len(devices) % num_slices:
        raise ConfigError("partitioning.num_slices", f"{num_slices} slices do not divide the {layout}")
    if devices[0].platform == "tpu":  # TPU devices know their slice (multislice: slice_index)
        found = len({getattr(d, "slice_index", 0) for d in devices})
        if found != num_slices:
            raise ConfigError(
                "partitioning.num_slices",
                f"is {num_slices}, but the TPU devices ({layout}) form {found} slice(s); set it to {found}",
            )
    dcn = {a: s for a, s in dcn.items() if a in mesh or s != 1}  # a size-1 expert axis is not in the mesh
    for axis, span in dcn.items():
        if mesh.get(axis, 1) % span:
            raise ConfigError(
                f"partitioning.dcn_mesh.{axis}",
                f"axis {axis!r} of mesh {mesh} cannot span {span} slices ({layout}): "
                f"{mesh[axis]} is not a multiple of {span}",
            )
    try:
        device_mesh = create_mesh(mesh, devices, num_slices=num_slices, dcn_axes=dcn)
    except MeshShapeError as e:
        raise ConfigError("partitioning.num_slices", f"{e} ({layout})") from None
    partitioner = Partitioner(device_mesh, standard_logical_axis_rules(fsdp=config.partitioning.fsdp_rules))
    check_expert_axis(dict(device_mesh.shape), lambda: check_model(config))
    if num_slices > 1:
        shard = partitioner.data_layout()
        log.info(
            "hybrid mesh over %d slices, %s spanning them: %s; process %d reads data shard %d of %d",
            num_slices,
            {a: s for a, s in dcn.items() if s > 1},
            dict(device_mesh.shape),
            jax.process_index(),
            shard.shard_id,
            shard.num_shards,
        )
    return partitioner


def make_schedule(config: ml_collections.ConfigDict) -> Callable:
    """The learning-rate schedule (`ConfigError` naming `optimizer` when it cannot be built)."""
    from cairn.trainer import cosine_schedule, factor_schedule, linear_schedule

    opt = config.optimizer
    if opt.schedule in ("cosine", "linear") and config.num_train_steps <= opt.warmup_steps:
        raise ConfigError(
            "optimizer.warmup_steps",
            f"{opt.warmup_steps} must be below num_train_steps "
            f"({config.num_train_steps}) for a {opt.schedule} schedule",
        )
    try:
        if opt.schedule == "factor":
            return factor_schedule(opt.factors, base_learning_rate=opt.learning_rate, warmup_steps=opt.warmup_steps)
        if opt.schedule == "constant":
            factors = "constant * linear_warmup" if opt.warmup_steps else "constant"
            return factor_schedule(factors, base_learning_rate=opt.learning_rate, warmup_steps=opt.warmup_steps)
        fn = cosine_schedule if opt.schedule == "cosine" else linear_schedule
        return fn(opt.learning_rate, config.num_train_steps, opt.warmup_steps, opt.final_learning_rate)
    except ValueError as e:
        raise ConfigError(f"optimizer.{'factors' if opt.schedule == 'factor' else 'schedule'}", str(e)) from None


def make_optimizer(config: ml_collections.ConfigDict) -> Any:
    """The `OptimizerConfig` of `optimizer.*` (`optimizer_setup.optimizer_config`)."""
    return optimizer_setup.optimizer_config(config)


def score_fn_factory(model: Any, batch_size: int, *, partitioner: Any, log_level: int = logging.INFO) -> Callable:
    """`make_score_fn(params)` for `Evaluator.evaluate`: each example's target log-likelihood, in
    global batches of `batch_size` rows sharded over the partitioner's mesh (`ShardedBatches`)."""

    batches = ShardedBatches(partitioner, model.score_batch, batch_size, "scores", log_level)

    def make(params):
        def fn(ds):
            idx, feats = _stacked(ds, None)
            return list(zip(idx.tolist(), batches(params, feats).tolist()))

        return fn

    return make


def _stacked(ds: Any, key: str | None) -> tuple[np.ndarray, Any]:
    """`(indices, features)` of an `(index, features)` dataset: every row stacked, in order
    (`features[key]` only, when `key` is given)."""
    rows = list(ds.as_numpy_iterator())
    idx = np.array([int(i) for i, _ in rows])
    feats = {k: np.stack([f[k] for _, f in rows]) for k in rows[0][1]}
    return idx, (feats[key] if key is not None else feats)


def make_evaluator(config: ml_collections.ConfigDict, loggers: tuple = (), decode: bool = False) -> Any:
    """A `cairn.evaluation.Evaluator` over `eval.task` (default `data.task`), `eval.split`. With
    `decode`, for a model that continues prompts (decoder-only), a `ContinuationEvaluator`:
    prediction metrics on the tasks' decode views (`decode_views`), score metrics as without."""
    from cairn.evaluation import Evaluator

    name = config.eval.task or config.data.task
    if decode and model_family(config.model.kind).continues_prompt:
        return ContinuationEvaluator(
            data_lib.get_tasks(config, "eval.task"),
            data_lib.feature_converter(config, pack=False),
            to_plain(config.data.sequence_length),
            split=config.eval.split,
            num_examples=config.eval.num_examples or None,
            seed=config.seed,
            loggers=loggers,
        )
    return Evaluator(
        name,
        data_lib.feature_converter(config, pack=False),
        split=config.eval.split,
        num_examples=config.eval.num_examples or None,
        seed=config.seed,
        sequence_length=data_lib.sequence_length(config),
        loggers=loggers,
    )


def make_eval_fn(config: ml_collections.ConfigDict, model: Any, evaluator: Any, partitioner: Any = None) -> Callable:
    """The trainer's `eval_fn`: the Evaluator's score metrics and, with `eval.decode_metrics`,
    its prediction metrics (the evaluator from `make_evaluator(config, decode=True)`), in
    sharded batches on the partitioner's mesh (default: `make_partitioner(config)`, the same mesh)."""
    from cairn.trainer import evaluator_callback

    partitioner = partitioner if partitioner is not None else make_partitioner(config)
    batch = config.eval.batch_size
    predict = (
        predict_fns.predict_fn_factory(config, model, batch, partitioner=partitioner, log_level=logging.DEBUG)
        if config.eval.decode_metrics
        else None
    )
    return evaluator_callback(
        evaluator,
        make_predict_fn=predict,
        make_score_fn=score_fn_factory(model, batch, partitioner=partitioner, log_level=logging.DEBUG),
    )


def trainer_config(config: ml_collections.ConfigDict) -> Any:
    from cairn.trainer import CheckpointConfig, TrainerConfig

    t = config.trainer
    return TrainerConfig(
        model_dir=config.model_dir,
        num_train_steps=config.num_train_steps,
        seed=config.seed,
        num_microbatches=t.num_microbatches,
        microbatch_reduction="sum" if loss_normalizing_factor(config) is None else "mean",
        checkpoint_every=t.checkpoint_every,
        eval_every=t.eval_every,
        log_every=t.log_every,
        checkpoint=CheckpointConfig(keep=t.keep_checkpoints or None, asynchronous=True),
        tensorboard=t.tensorboard,
        wandb=config.logging.wandb,
        offload_optimizer_state=t.offload_optimizer_state,
        offload_params=t.offload_params,
    )


def make_trainer(
    config: ml_collections.ConfigDict,
    model: Any,
    partitioner: Any,
    eval_fn: Callable | None = None,
    step_hooks: Sequence[Callable] = (),
    batch_hooks: Sequence[Callable] = (),
    schedule: Callable | None = None,
) -> Any:
    """The `Trainer` (the resolved config is its `experiment_config`, stored in checkpoints);
    `step_hooks` run after every step and `batch_hooks` before every `fingerprint_every`-th
    (the run fingerprint's). `schedule`: `make_schedule(config)` when the caller has it."""
    from cairn.trainer import Trainer

    schedule = schedule if schedule is not None else make_schedule(config)
    return Trainer(
        model,
        make_optimizer(config),
        schedule,
        partitioner,
        trainer_config(config),
        eval_fn=eval_fn,
        experiment_config=to_plain(config),
        step_hooks=list(step_hooks),
        batch_hooks=list(batch_hooks),
        batch_hook_every=max(1, config.fingerprint_every),
    )


INIT_SOURCES = ("init.checkpoint", "init.hf_checkpoint", "init.t5x_checkpoint", "init.upcycle_from")


def init_source(config: ml_collections.ConfigDict) -> str:
    """The path of the `init.*` source set ('' for none; validation allows one)."""
    return next((config.init[k.split(".")[1]] for k in INIT_SOURCES if config.init[k.split(".")[1]]), "")


def pretrained_params(config: ml_collections.ConfigDict, trainer: Any, first_batch: Any) -> Any:
    """Params to start from (`init.checkpoint` via `restore_params`, `init.hf_checkpoint` via
    `import_hf`, `init.t5x_checkpoint` via `import_t5x`, `init.upcycle_from` via
    `upcycled_params`), sharded as the trainer wants; None without any, and for a LoRA run
    (its adapters start fresh: the source is its base, `base_params`)."""
    if not init_source(config) or config.model.lora.rank is not None:
        return None
    return _source_params(config, trainer, trainer.setup(first_batch).params)


def base_params(config: ml_collections.ConfigDict, trainer: Any, first_batch: Any) -> Any:
    """A LoRA run's frozen base: the `init.*` source's params, sharded as the trainer's frozen
    tree; None for a run without LoRA."""
    if config.model.lora.rank is None:
        return None
    return _source_params(config, trainer, trainer.setup(first_batch).frozen)


def _source_params(config: ml_collections.ConfigDict, trainer: Any, abstract: Any) -> Any:
    """The `init.*` source's params read into `abstract` (ShapeDtypeStructs with shardings)."""
    if config.init.checkpoint:
        from cairn.trainer import restore_params

        return restore_params(config.init.checkpoint, abstract, step=config.init.checkpoint_step)
    if config.init.upcycle_from:
        return upcycled_params(config, trainer, abstract)
    if config.init.t5x_checkpoint:
        try:
            params = import_t5x(config.init.t5x_checkpoint, abstract, step=config.init.checkpoint_step)
        except T5xCheckpointError as e:
            raise ConfigError("init.t5x_checkpoint", str(e)) from None
        return jax.tree.map(lambda p, a: jax.device_put(p, a.sharding), params, abstract)
    _, params = hf_converter(config.model.kind).import_dir(
        config.init.hf_checkpoint, **to_plain(config.model.overrides)
    )
    shapes = jax.tree.map(np.shape, params)
    want = jax.tree.map(lambda a: a.shape, abstract)
    if shapes != want:
        raise ConfigError(
            "init.hf_checkpoint",
            "the checkpoint's parameter shapes differ from the model's (vocabulary or model.overrides?)",
        )
    return jax.tree.map(lambda p, a: jax.device_put(np.asarray(p, a.dtype), a.sharding), params, abstract)
