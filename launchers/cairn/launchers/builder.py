"""From a run's `RunSpec` to the objects of a run: model, partitioner, evaluator, trainer,
initial params. The train, eval and infer entry points share these functions."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from cairn.launchers import data as data_lib
from cairn.launchers import predict_fns
from cairn.launchers.config_base import model_family
from cairn.launchers.lm_evaluator import ContinuationEvaluator
from cairn.launchers.run_spec import MeshSpec, RunSpec, loss_normalizing_factor
from cairn.launchers.sharded_batches import ShardedBatches
from cairn.launchers.validation import ConfigError
from cairn.models.t5x_checkpoint import T5xCheckpointError, import_t5x
from cairn.partitioning import MeshShapeError, Partitioner, create_mesh, standard_logical_axis_rules
from cairn.partitioning.mesh import resolve_axes

log = logging.getLogger(__name__)


def hf_converter(kind: str) -> Any:
    """The Hugging Face converter of model family `kind` (`ConfigError` naming `init.hf_checkpoint`
    when the family has none)."""
    hf = model_family(kind).hf
    if hf is None:
        raise ConfigError("init.hf_checkpoint", f"model.kind {kind!r} has no Hugging Face import")
    return hf


def load_model(spec: RunSpec) -> Any:
    """The model family's model (`EncoderDecoderModel`, `DecoderOnlyModel`) of the spec's
    network config (no parameters yet)."""
    from cairn.models import flops_per_token

    model = model_family(spec.keys.model.kind).make_model(
        spec.model,
        label_smoothing=spec.keys.model.label_smoothing,
        z_loss=spec.keys.model.z_loss,
        loss_normalizing_factor=loss_normalizing_factor(spec.keys),
    )
    try:
        model.flops_per_token = flops_per_token(spec.model, dict(spec.reader.sequence_length))
    except Exception:  # FLOPs are for MFU only
        pass
    return model


def trainable_model(spec: RunSpec, model: Any) -> Any:
    """What the trainer trains: `model`, or with `model.lora.rank` set (`spec.lora`) a
    `cairn.models.lora.LoraModel` over it (its params the adapters, `model`'s the frozen base),
    or with `model.prompt_tuning.length` set a `cairn.models.prompt_tuning.PromptTuningModel`
    (its params the prompt)."""
    trainable: Any
    if spec.prompt_tuning is not None:
        from cairn.models.prompt_tuning import PromptTuningModel

        trainable = PromptTuningModel(model, spec.prompt_tuning)
    elif spec.lora is not None:
        from cairn.models.lora import LoraModel

        trainable = LoraModel(model, spec.lora)
    else:
        return model
    trainable.flops_per_token = getattr(model, "flops_per_token", None)  # MFU: the forward and backward it runs
    return trainable


def upcycled_params(spec: RunSpec, trainer: Any, abstract: Any) -> Any:
    """The MoE model's params upcycled (`cairn.models.upcycle`) from the dense checkpoint
    `init.upcycle_from` (the same model without `moe`), routers drawn from the run's init key.
    Shapes are checked against the checkpoint's metadata first: `ConfigError` naming the tensor."""
    from cairn.models import UpcycleError, upcycle
    from cairn.trainer import restore_params, stored_params

    moe_config = trainer.model.config
    dense_config = moe_config.replace(moe=None)
    rng = jax.random.fold_in(jax.random.PRNGKey(spec.keys.seed), 0)  # the Trainer's init key
    build = lambda dense: upcycle(dense, dense_config, moe_config, rng)
    source, step = spec.keys.init.upcycle_from, spec.keys.init.checkpoint_step
    try:
        jax.eval_shape(build, stored_params(source, step))
    except UpcycleError as e:
        raise ConfigError("init.upcycle_from", str(e)) from None
    dense_model = model_family(spec.keys.model.kind).make_model(dense_config)
    shapes = jax.eval_shape(dense_model.init, rng)
    shardings = trainer.partitioner.shardings_for(dense_model.logical_axes(), shapes)
    dense_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
    dense = restore_params(source, dense_abstract, step=step)
    return jax.jit(build, out_shardings=jax.tree.map(lambda a: a.sharding, abstract))(dense)


def make_partitioner(spec: MeshSpec, mesh: dict[str, int], devices: Sequence[Any], process_count: int) -> Any:
    """The `Partitioner` over `devices` with `mesh` (`spec.resolve`'s: it fits them). With
    `partitioning.num_slices` > 1 the mesh is hybrid: each `partitioning.dcn_mesh` axis spans
    that many slices (DCN), the rest of it stays inside a slice (ICI). `ConfigError` naming the
    key when the slices do not fit the devices. `run_spec.bind` calls it."""

    num_slices = spec.num_slices
    dcn = dict(spec.dcn)
    try:  # its -1 axis: partitioning's own resolution, over slices instead of devices
        dcn = resolve_axes(dcn, num_slices)
    except MeshShapeError as e:
        why = f"does not fit partitioning.num_slices={num_slices}: {e} (slices counted as devices)"
        raise ConfigError("partitioning.dcn_mesh", why) from None
    layout = f"{process_count} process(es), {len(devices)} devices"
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
        device_mesh = create_mesh(mesh, list(devices), num_slices=num_slices, dcn_axes=dcn)
    except MeshShapeError as e:
        raise ConfigError("partitioning.num_slices", f"{e} ({layout})") from None
    partitioner = Partitioner(device_mesh, standard_logical_axis_rules(fsdp=spec.fsdp_rules))
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


def make_evaluator(spec: RunSpec, loggers: tuple = (), decode: bool = False, num_examples: int | None = None) -> Any:
    """A `cairn.evaluation.Evaluator` over `eval.task` (default `data.task`), `eval.split`. With
    `decode`, for a model that continues prompts (decoder-only), a `ContinuationEvaluator`:
    prediction metrics on the tasks' decode views (`decode_views`), score metrics as without.
    `num_examples`: examples per task (default `eval.num_examples`; 0: all)."""
    from cairn.evaluation import Evaluator

    keys = spec.keys
    name = keys.eval.task or keys.data.task
    n = (keys.eval.num_examples if num_examples is None else num_examples) or None
    if decode and model_family(keys.model.kind).continues_prompt:
        return ContinuationEvaluator(
            data_lib.get_tasks(keys, "eval.task"),
            data_lib.feature_converter(spec.reader, pack=False),
            dict(keys.data.sequence_length),
            split=keys.eval.split,
            num_examples=n,
            seed=keys.seed,
            loggers=loggers,
        )
    return Evaluator(
        name,
        data_lib.feature_converter(spec.reader, pack=False),
        split=keys.eval.split,
        num_examples=n,
        seed=keys.seed,
        sequence_length=dict(spec.reader.sequence_length),
        loggers=loggers,
    )


def params_evaluation(
    spec: RunSpec,
    model: Any,
    partitioner: Any,
    evaluator: Any,
    batch_size: int,
    decode: bool,
    log_level: int = logging.INFO,
) -> Callable[[Any, int], Any]:
    """`evaluate(params, step) -> EvaluationResult`: the Evaluator's score metrics and, with
    `decode`, its prediction metrics, in sharded batches of `batch_size` rows (what eval, the
    final evaluation after training and `InteractiveModel.evaluate` run; the programs are
    compiled once for every call)."""
    score = score_fn_factory(model, batch_size, partitioner=partitioner, log_level=log_level)
    predict = (
        predict_fns.predict_fn_factory(spec, model, batch_size, partitioner=partitioner, log_level=log_level)
        if decode
        else None
    )

    def evaluate(params: Any, step: int) -> Any:
        return evaluator.evaluate(score_fn=score(params), predict_fn=predict(params) if predict else None, step=step)

    return evaluate


def make_eval_fn(spec: RunSpec, model: Any, evaluator: Any, partitioner: Any) -> Callable:
    """The trainer's `eval_fn`: the Evaluator's score metrics and, with `eval.decode_metrics`,
    its prediction metrics (the evaluator from `make_evaluator(spec, decode=True)`), in
    sharded batches on the partitioner's mesh."""
    from cairn.trainer import evaluator_callback

    batch = spec.keys.eval.batch_size
    predict = (
        predict_fns.predict_fn_factory(spec, model, batch, partitioner=partitioner, log_level=logging.DEBUG)
        if spec.keys.eval.decode_metrics
        else None
    )
    return evaluator_callback(
        evaluator,
        make_predict_fn=predict,
        make_score_fn=score_fn_factory(model, batch, partitioner=partitioner, log_level=logging.DEBUG),
    )


def make_trainer(
    spec: RunSpec,
    model: Any,
    partitioner: Any,
    eval_fn: Callable | None = None,
    step_hooks: Sequence[Callable] = (),
    batch_hooks: Sequence[Callable] = (),
) -> Any:
    """The `Trainer` of the spec's optimizer, schedule and `TrainerConfig` (the resolved config
    is its `experiment_config`, stored in checkpoints); `step_hooks` run after every step and
    `batch_hooks` before every `fingerprint_every`-th (the run fingerprint's)."""
    from cairn.trainer import Trainer

    return Trainer(
        model,
        spec.optimizer,
        spec.schedule,
        partitioner,
        spec.trainer,
        eval_fn=eval_fn,
        experiment_config=copy.deepcopy(dict(spec.plain)),
        step_hooks=list(step_hooks),
        batch_hooks=list(batch_hooks),
        batch_hook_every=max(1, spec.keys.fingerprint_every),
    )


INIT_SOURCES = ("init.checkpoint", "init.hf_checkpoint", "init.t5x_checkpoint", "init.upcycle_from")


def init_source(spec: RunSpec) -> str:
    """The path of the `init.*` source set ('' for none; validation allows one)."""
    paths = (getattr(spec.keys.init, k.split(".")[1]) for k in INIT_SOURCES)
    return next((p for p in paths if p), "")


def pretrained_params(spec: RunSpec, trainer: Any, first_batch: Any) -> Any:
    """Params to start from (`init.checkpoint` via `restore_params`, `init.hf_checkpoint` via
    `import_hf`, `init.t5x_checkpoint` via `import_t5x`, `init.upcycle_from` via
    `upcycled_params`), sharded as the trainer wants; None without any, and for a LoRA or
    prompt-tuning run (the source is its base, `base_params`; its own params: `initial_prompt`)."""
    if not init_source(spec) or adapts_a_base(spec):
        return None
    return _source_params(spec, trainer, trainer.setup(first_batch).params)


def adapts_a_base(spec: RunSpec) -> bool:
    """Whether the run trains something over a frozen base (LoRA, prompt tuning)."""
    return spec.lora is not None or spec.prompt_tuning is not None


def base_params(spec: RunSpec, trainer: Any, first_batch: Any) -> Any:
    """A LoRA or prompt-tuning run's frozen base: the `init.*` source's params, sharded as the
    trainer's frozen tree; None for a run without a frozen base."""
    if not adapts_a_base(spec):
        return None
    return _source_params(spec, trainer, trainer.setup(first_batch).frozen)


def initial_prompt(spec: RunSpec, trainer: Any, base: Any) -> Any:
    """A prompt-tuning run's first prompt (`PromptTuningModel.initial_params`: the configured init
    from the base's embedding table), drawn from the run's init key (`fold_in(seed, 0)`, the
    trainer's); None for another run."""
    if spec.prompt_tuning is None:
        return None
    rng = jax.random.fold_in(jax.random.PRNGKey(spec.keys.seed), 0)
    return jax.jit(trainer.model.initial_params)(rng, base)


def _source_params(spec: RunSpec, trainer: Any, abstract: Any) -> Any:
    """The `init.*` source's params read into `abstract` (ShapeDtypeStructs with shardings)."""
    if spec.keys.init.checkpoint:
        from cairn.trainer import restore_params

        return restore_params(spec.keys.init.checkpoint, abstract, step=spec.keys.init.checkpoint_step)
    if spec.keys.init.upcycle_from:
        return upcycled_params(spec, trainer, abstract)
    if spec.keys.init.t5x_checkpoint:
        try:
            params = import_t5x(spec.keys.init.t5x_checkpoint, abstract, step=spec.keys.init.checkpoint_step)
        except T5xCheckpointError as e:
            raise ConfigError("init.t5x_checkpoint", str(e)) from None
        return jax.tree.map(lambda p, a: jax.device_put(p, a.sharding), params, abstract)
    _, params = hf_converter(spec.keys.model.kind).import_dir(spec.keys.init.hf_checkpoint, **spec.keys.model.overrides)
    shapes = jax.tree.map(np.shape, params)
    want = jax.tree.map(lambda a: a.shape, abstract)
    if shapes != want:
        raise ConfigError(
            "init.hf_checkpoint",
            "the checkpoint's parameter shapes differ from the model's (vocabulary or model.overrides?)",
        )
    return jax.tree.map(lambda p, a: jax.device_put(np.asarray(p, a.dtype), a.sharding), params, abstract)
