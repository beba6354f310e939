"""`Trainer`: the training loop with evaluation, checkpoints, summaries, MFU and fault handling."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from cairn.partitioning import GatheredDigests, Partitioner, estimate_memory, platform
from cairn.partitioning.peer_watchdog import await_lost_peer
from cairn.trainer import history
from cairn.trainer.callbacks import EvalFn, takes_metrics
from cairn.trainer.checkpoints import CheckpointConfig, Checkpointer, abstract_like
from cairn.trainer.data_state import TfDataIterator, is_tf_iterator
from cairn.trainer.faults import SigtermFlag
from cairn.trainer.lock import ModelDirLock
from cairn.trainer.loop import StepProgram, TrainLoop, TrainResult
from cairn.trainer.model_protocol import (
    BatchSignature,
    batch_signature,
    init_model_state,
    leaf_dtype,
    model_flops_per_token,
    trace_init,
)
from cairn.trainer.offload_update import DEFAULT_GROUP_BYTES
from cairn.trainer.optimizers import OptimizerConfig, as_schedule, make_optimizer
from cairn.trainer.param_offload import (
    ParamOffload,
    cast_only_dtypes,
    device_copy,
    memory_shardings,
    params_on_device,
)
from cairn.trainer.summaries import SummaryWriter
from cairn.trainer.train_state import TrainState
from cairn.trainer.train_step import (
    batch_shardings,
    check_host_memory,
    make_train_step,
    offload_opt_state_shardings,
    opt_state_specs,
    partitioned_train_step,
    state_shardings,
)

log = logging.getLogger("cairn.trainer")
StepHook = Callable[[int, TrainState], None] | Callable[[int, TrainState, Mapping[str, float]], None]
BatchHook = Callable[[int, GatheredDigests], None]


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The loop's settings. `checkpoint_every`/`eval_every`/`log_every` are in steps (0: never;
    a final checkpoint is always written). `flops_per_token` overrides the model's;
    `peak_flops` overrides the device table (on CPU, where no
    peak is known, it is the only way to get MFU). `microbatch_reduction`: 'mean' for a
    loss that is a mean over its (micro)batch, 'sum' for one that is a sum or divided by a
    constant (t5x's loss_normalizing_factor); either way accumulation matches one full batch.
    `wandb`: a Weights & Biases project to log to as well (offline, under model_dir; '' off).
    `progress`: the console's progress line (process 0); `progress_interval_s` its interval
    (None: 0.5 s on a terminal, 60 s in a file or pipe). `offload_optimizer_state`: the optimizer
    state lives in host memory (`memory_kind="pinned_host"`) and visits the device only for the
    update inside the step, freeing its device memory for the forward and backward passes
    (float32 master statistics on one chip); checkpoints save and restore it as usual. With an
    `OptimizerConfig` and `offload_group_bytes` > 0 the update moves the state of that many bytes
    of parameters at a time (`offload_update.grouped_update`: the device never holds the whole
    state; equal to the whole update within float32 rounding); 0 moves the whole state at once
    (bit-identical to no offload). `offload_params`: the parameters (float32 master weights) live
    in host memory too; each step works on a device copy in the precision the model computes in
    (`param_offload`: the kernels a bfloat16 model casts arrive as bfloat16, a group at a time),
    with gradients bit-identical to the stored parameters' and accumulated in float32 over
    microbatches, so that one chip trains a model whose float32 parameters, gradients and
    moments would not fit (with `num_microbatches`, the transfers are paid once per step).
    `compiler_options`: XLA flags for the train step's compile (`jax.jit`'s `compiler_options`;
    e.g. `{"xla_tpu_scheduler_percent_shared_memory_limit": 50}`: XLA:TPU's scheduler counts
    temporaries against the whole chip, not the chip less the arguments, and with offloaded
    state it fills that memory with early host transfers); a copy, sorted by name."""

    model_dir: str
    num_train_steps: int
    seed: int = 0
    num_microbatches: int = 1
    microbatch_reduction: str = "mean"
    checkpoint_every: int = 1000
    eval_every: int = 0
    log_every: int = 100
    checkpoint: CheckpointConfig = CheckpointConfig()
    tensorboard: bool = True
    wandb: str = ""
    progress: bool = True
    progress_interval_s: float | None = None
    donate_state: bool = False
    handle_sigterm: bool = True
    flops_per_token: float | None = None
    peak_flops: float | None = None
    offload_optimizer_state: bool = False
    offload_group_bytes: int = 0
    offload_params: bool = False
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(
            self, "compiler_options", {str(k): v for k, v in sorted(dict(self.compiler_options).items())}
        )
        for name in ("num_train_steps", "num_microbatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.microbatch_reduction not in ("mean", "sum"):
            raise ValueError(
                f"TrainerConfig.microbatch_reduction must be 'mean' or 'sum', got {self.microbatch_reduction!r}"
            )
        for name in ("checkpoint_every", "eval_every", "log_every", "offload_group_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainerConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class _StepSetup:
    """What `Trainer.setup` builds for one batch shape."""

    param_specs: Any
    state_shardings: TrainState
    abstract_state: TrainState
    abstract_batch: Any  # the global batch's ShapeDtypeStructs, with their shardings
    train_step: Any
    create: Any
    attach: Any  # state -> state with `compute` made from its params (offloaded params)
    frozen_specs: Any = None  # the frozen tree's logical specs (a model with a `frozen_model`)
    model_state: Any = None  # () -> the state a fresh run's step carries beside the params, or None


def _is_abstract(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


class Trainer:
    """Trains `model` (see `TrainableModel`) with `optimizer` on `partitioner`'s mesh.

    Args:
      model: has `init(rng, batch)` and `loss_fn(params, batch, dropout_rng)`.
      optimizer: an `OptimizerConfig` (one factored by logical axes is built in `setup`, from the
        params' specs), or an optax transformation.
      learning_rate: a float or a schedule (a function of the step).
      partitioner: a `cairn.partitioning.Partitioner`.
      config: a `TrainerConfig`.
      eval_fn: `eval_fn(params, step) -> {name: value}` (or `{task: {metric: value}}`), called
        every `eval_every` steps; see `evaluator_callback`.
      experiment_config: a JSON-able dict stored in every checkpoint.
      step_hooks: functions `hook(step, state)` called in order after every train step (after
        evaluation, before SIGTERM and checkpoint handling), on every process; `state` is the
        `TrainState` after the step. A hook taking three arguments is called as
        `hook(step, state, metrics)`, `metrics` the step's `{name: float}` (loss, grad_norm,
        learning_rate...; fetched from the device when read). A hook that runs a collective
        (e.g. all-gathers params) is called at the same step on every process.
      batch_hooks: functions `hook(step, digests)` called on every process before step `step`
        is trained, for steps that are multiples of `batch_hook_every`, with the row digests of
        its global batch gathered from every process (`cairn.partitioning.GatheredDigests`;
        `digests.fingerprint()` is the global batch's hash, independent of the host count).
        Each call costs a small all-gather, which waits for the previous step to finish.

    With several processes, the first step of every `train` call checks that hosts of one
    data-parallel replica feed identical rows (`ReplicaBatchMismatchError` otherwise).

    A model with a `frozen_model` (`cairn.models.lora.LoraModel`) trains its params against a
    frozen tree, the `frozen_model`'s params given to `train(frozen_params=...)` (sharded by their
    own logical specs; no gradient, no optimizer state, never checkpointed: a resumed run is
    given them again). Its `loss_fn` takes them as a fourth argument, and `eval_fn` and
    `eval_params` get `model.merged(params, frozen)`, the `frozen_model`'s params.
    """

    def __init__(
        self,
        model: Any,
        optimizer: OptimizerConfig | optax.GradientTransformation,
        learning_rate: float | Callable,
        partitioner: Partitioner,
        config: TrainerConfig,
        eval_fn: EvalFn | None = None,
        experiment_config: Mapping[str, Any] | None = None,
        *,
        step_hooks: Sequence[StepHook] = (),
        batch_hooks: Sequence[BatchHook] = (),
        batch_hook_every: int = 1,
    ):
        self.model = model
        self.schedule = as_schedule(learning_rate)
        self.optimizer_config = optimizer if isinstance(optimizer, OptimizerConfig) else None
        self._learning_rate = learning_rate
        self.optimizer: Any = optimizer
        if self.optimizer_config is not None:  # factored by logical axes: built in `setup` (specs)
            needs_axes = self.optimizer_config.needs_param_axes
            with platform.for_devices(partitioner.mesh.devices.flat):  # its code follows the mesh's platform
                self.optimizer = None if needs_axes else make_optimizer(self.optimizer_config, learning_rate)
        self.partitioner = partitioner
        self.config = config
        self.eval_fn = eval_fn
        self.experiment_config = dict(experiment_config or {})
        self.step_hooks = tuple(step_hooks)
        self.batch_hooks = tuple(batch_hooks)
        if isinstance(batch_hook_every, bool) or not isinstance(batch_hook_every, int) or batch_hook_every < 1:
            raise ValueError(f"Trainer batch_hook_every must be an int >= 1, got {batch_hook_every!r}")
        self.batch_hook_every = batch_hook_every
        for hook in self.step_hooks + self.batch_hooks:
            if not callable(hook):
                raise TypeError(f"Trainer step_hooks and batch_hooks must be callables, got {hook!r}")
        self.hooks_take_metrics = tuple(takes_metrics(hook) for hook in self.step_hooks)
        self.batch_signature: BatchSignature | None = None  # the batch `setup` was given
        self.abstract_state: Any = None  # a TrainState of ShapeDtypeStructs, once set up
        self.abstract_batch: Any = None  # the set-up global batch's ShapeDtypeStructs

    # -- setup ---------------------------------------------------------------------------
    def _keys(self):
        """(init key, dropout seed) of `config.seed`; called inside jitted functions (eagerly, each op compiles)."""
        root = jax.random.PRNGKey(self.config.seed)
        return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)  # (init, dropout seed)

    def setup(self, batch: Mapping[str, Any]) -> TrainState:
        """Abstract state, shardings, the partitioned step and the init function for this batch's
        shapes; returns the abstract state. Done once: called again with a batch of the same
        shapes and dtypes (`batch_signature`), it returns at once. `train` sets up from the data's
        first batch unless `setup` was called before (then the first batch must match). `batch`
        is a host-local batch: arrays, or `jax.ShapeDtypeStruct`s (nothing is read from it)."""
        signature = batch_signature(batch)
        if signature == self.batch_signature:
            return self.abstract_state
        built = self._build(batch)
        self.param_specs, self.state_shardings = built.param_specs, built.state_shardings
        self.abstract_state, self.abstract_batch = built.abstract_state, built.abstract_batch
        self.train_step, self._create, self._attach = built.train_step, built.create, built.attach
        self._model_state = built.model_state
        self.batch_signature = signature
        return self.abstract_state

    def lower_step(self, batch: Mapping[str, Any] | None = None) -> jax.stages.Lowered:
        """The partitioned train step lowered for a host-local `batch` (arrays or `jax.ShapeDtypeStruct`s;
        default: the batch `setup` was given) on abstract state: nothing is allocated or run.
        `.compile().memory_analysis()` is what `plan_memory` reads. Other shapes leave the set-up as it is."""
        if batch is None or batch_signature(batch) == self.batch_signature:
            if self.batch_signature is None:
                raise ValueError("Trainer.lower_step needs a batch before the trainer is set up (Trainer.setup)")
            return self.train_step.lower(self.abstract_state, self.abstract_batch)
        built = self._build(batch)
        return built.train_step.lower(built.abstract_state, built.abstract_batch)

    def _build(self, batch: Mapping[str, Any]) -> _StepSetup:
        """Everything `setup` keeps, for `batch`'s shapes, without keeping it; traced for the
        mesh's platform (a described TPU slice's: `platform.for_devices`), as the partitioned
        step traces itself."""
        with platform.for_devices(self.partitioner.mesh.devices.flat):
            return self._build_for(batch)

    def _build_for(self, batch: Mapping[str, Any]) -> _StepSetup:
        init_key = jax.eval_shape(lambda: self._keys()[0])  # abstract: traced, nothing run
        # The model's init on host zeros (token ids: small), traced once with the mesh and partitioner
        # active as `create` runs: param shapes and specs now, replayed (not retraced) by `create`.
        host = jax.tree.map(lambda x: np.zeros(np.shape(x), leaf_dtype(x)), batch)
        frozen_model = getattr(self.model, "frozen_model", None)
        if frozen_model is not None and self.config.offload_params:
            raise ValueError(
                "TrainerConfig.offload_params is not supported for a model with a frozen tree "
                "(model.frozen_model, e.g. LoRA): the adapters are small, keep the params on the device"
            )
        frozen_shapes = frozen_specs = None
        with jax.set_mesh(self.partitioner.mesh), self.partitioner.activated():
            traced = trace_init(self.model, init_key, dict(host))
            if frozen_model is not None:
                frozen_traced = trace_init(frozen_model, init_key, dict(host))
                frozen_shapes, frozen_specs = frozen_traced.shapes, frozen_traced.specs
        param_shapes, specs = traced.shapes, traced.specs
        if self.optimizer is None:  # factored by logical axes: built once, from the specs
            assert self.optimizer_config is not None
            self.optimizer = make_optimizer(self.optimizer_config, self._learning_rate, param_axes=specs)
        optimizer = self.optimizer

        def model_state():  # what the step carries beside the params (fp8 amax histories): constants
            return init_model_state(self.model, dict(host))

        state_shapes = jax.eval_shape(
            lambda p, f: TrainState.create(p, optimizer, self._keys()[1], f, model_state()), param_shapes, frozen_shapes
        )
        state_sh = state_shardings(self.partitioner, state_shapes, specs, optimizer, frozen_specs)
        offload = None
        if self.config.offload_optimizer_state:
            check_host_memory(self.partitioner)
            state_sh, offload = offload_opt_state_shardings(state_sh)
        param_offload = None
        if self.config.offload_params:
            check_host_memory(self.partitioner, "offload_params")
            device_sh, host_sh = memory_shardings(state_sh.params)
            with jax.set_mesh(self.partitioner.mesh), self.partitioner.activated():
                key = jax.eval_shape(lambda: self._keys()[0])
                dtypes = cast_only_dtypes(lambda p, k: self.model.loss_fn(p, dict(host), k)[0], param_shapes, key)
            param_offload = ParamOffload(
                device_sh, host_sh, dtypes, self.config.offload_group_bytes or DEFAULT_GROUP_BYTES
            )
            state_sh = state_sh.replace(
                params=param_offload.param_shardings(), compute=param_offload.compute_shardings()
            )
            state_shapes = state_shapes.replace(compute=param_offload.compute_shapes(state_shapes.params))
        shards = self.partitioner.data_layout().num_shards
        gbatch_shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((np.shape(x)[0] * shards,) + np.shape(x)[1:], leaf_dtype(x)), host
        )
        batch_sh = batch_shardings(self.partitioner, gbatch_shapes)
        step_fn = make_train_step(
            self.model.loss_fn,
            optimizer,
            self.schedule,
            self.config.num_microbatches,
            self.config.microbatch_reduction,
            offload_shardings=offload,
            offload_group_bytes=self.config.offload_group_bytes if self.optimizer_config is not None else None,
            param_offload=param_offload,
        )
        train_step = partitioned_train_step(
            step_fn, self.partitioner, state_sh, batch_sh, self.config.donate_state, self.config.compiler_options
        )

        def create(frozen=None):
            init_key, dropout_seed = self._keys()
            state = TrainState.create(traced(init_key), optimizer, dropout_seed, frozen, model_state())
            return state if param_offload is None else state.replace(compute=param_offload.copy_of(state.params))

        def attach(state: TrainState) -> TrainState:  # offloaded params: their device copy
            if param_offload is None:
                return state
            po = param_offload
            return state.replace(compute=device_copy(state.params, po.dtypes, po.device, po.group_bytes))

        in_sh = None if frozen_model is None else (state_sh.frozen,)
        return _StepSetup(
            param_specs=specs,
            state_shardings=state_sh,
            abstract_state=abstract_like(state_shapes, state_sh),
            abstract_batch=abstract_like(gbatch_shapes, batch_sh),
            train_step=train_step,
            create=self.partitioner.partition(create, in_shardings=in_sh, out_shardings=state_sh),
            attach=self.partitioner.partition(
                attach, in_shardings=(state_sh.replace(compute=None),), out_shardings=state_sh
            ),
            frozen_specs=frozen_specs,
            model_state=model_state,
        )

    def _frozen(self, frozen: Any) -> Any:
        """The frozen tree on its shardings (None for a model without a `frozen_model`); a
        `ValueError` when the model has one and `frozen` is missing."""
        if self.state_shardings.frozen is None:
            return None
        if frozen is None:
            raise ValueError("the model adapts frozen params (model.frozen_model): pass train(frozen_params=...)")
        return jax.device_put(frozen, self.state_shardings.frozen)

    def initial_state(self, params: Any = None, frozen: Any = None) -> TrainState:
        """A fresh state (params from the model's init, or the given `params`, e.g. pretrained;
        `frozen`: the frozen tree of a model with a `frozen_model`)."""
        frozen = self._frozen(frozen)
        if params is None:
            return self._create() if frozen is None else self._create(frozen)
        params = jax.device_put(params, self.state_shardings.params)
        no_copy = self.state_shardings.replace(compute=None)
        state = self.partitioner.partition(
            lambda p, f: TrainState.create(p, self.optimizer, self._keys()[1], f, self._model_state()),
            out_shardings=no_copy,
        )(params, frozen)
        return self._attach(state) if self.config.offload_params else state

    def eval_params(self, state: TrainState) -> Any:
        """The params evaluation and decoding use, on the device (`params_on_device`):
        `state.params`, or for a state with a frozen tree the model's `merged(params, frozen)`
        (jitted; sharded as the frozen tree, or as the model's `merged_shardings(params
        shardings, frozen shardings)` when it has one)."""
        params = params_on_device(state.params)
        if state.frozen is None:
            return params
        if getattr(self, "_merge", None) is None:
            sh = self.state_shardings
            # A model whose merged tree is not shaped like its frozen one (prompt tuning adds
            # the prompt) says how to lay it out.
            layout = getattr(self.model, "merged_shardings", None)
            out = sh.frozen if layout is None else layout(sh.params, sh.frozen)
            self._merge = self.partitioner.partition(self.model.merged, out_shardings=out)
        return self._merge(params, state.frozen)

    def _log_memory(self) -> None:
        ospecs = opt_state_specs(
            self.optimizer, self.abstract_state.opt_state, self.abstract_state.params, self.param_specs
        )
        est = estimate_memory(
            self.abstract_state.params,
            self.param_specs,
            self.partitioner,
            opt_state=self.abstract_state.opt_state,
            opt_state_specs=ospecs,
        )
        log.debug("estimated memory per device (mesh %s):\n%s", dict(self.partitioner.mesh.shape), est)
        self.memory_estimate = est

    # -- train: set up once, then the loop -------------------------------------------------
    def make_summaries(self) -> SummaryWriter:
        """This process's `SummaryWriter` for the config's model_dir and writers (process 0
        writes; every process logs the values at DEBUG, with several processes prefixed with its
        name: the progress line shows them, from process 0 only)."""
        cfg = self.config
        index, processes = jax.process_index(), jax.process_count()
        return SummaryWriter(
            cfg.model_dir,
            cfg.tensorboard,
            primary=index == 0,
            log_prefix=f"process {index}/{processes}: " if processes > 1 else "",
            wandb=cfg.wandb,
            log_level=logging.DEBUG,
        )

    def train(
        self,
        data: Iterator[Mapping[str, Any]],
        init_params: Any = None,
        summaries: SummaryWriter | None = None,
        model_dir_lock: ModelDirLock | None = None,
        on_start: Callable[[int], None] | None = None,
        frozen_params: Any = None,
    ) -> TrainResult:
        """Trains to `config.num_train_steps`, resuming from the latest checkpoint in model_dir.

        `data` yields host-local numpy batches; if it has `get_state()`/`set_state(dict)` its
        position is checkpointed and restored; a tf.data iterator is checkpointed with
        `tf.train.Checkpoint` (see `TfDataIterator`). `init_params` (used only when model_dir has no
        checkpoint) starts from given params, e.g. `restore_params(...)` of a pretrained run.
        Returns at the end, or after saving when SIGTERM arrives (`preempted=True`). Raises
        `NonFiniteLossError` on a NaN/Inf loss, keeping the last good checkpoint. `summaries`
        (default: `make_summaries()`, closed at the end): a caller's writer, flushed on every
        way out but left open (e.g. for the final evaluation at the last step).
        `model_dir_lock`: the model_dir's lock, already held by the caller (who releases it);
        by default process 0 takes it here. `on_start(step)`: called on every process once the
        state to train from is known (restored at `step`, or fresh at 0), before the first
        step: where a caller writes its run files, so that a refused restore (every checkpoint
        corrupt) leaves model_dir as it was. `frozen_params`: the frozen tree of a model with a
        `frozen_model` (a LoRA run's base params), fresh or resumed.
        """
        cfg = self.config
        # One lock per run: process 0 holds it for every host (they share model_dir).
        lock = None
        if jax.process_index() == 0 and not (model_dir_lock is not None and model_dir_lock.held):
            lock = ModelDirLock(cfg.model_dir).acquire()
        sigterm = SigtermFlag().install() if cfg.handle_sigterm else SigtermFlag()
        ckpt = None
        owned = summaries is None
        try:
            ckpt = Checkpointer(cfg.model_dir, cfg.checkpoint)
            if summaries is None:
                summaries = self.make_summaries()
            return self._train(data, init_params, ckpt, summaries, sigterm, on_start, frozen_params)
        except jax.errors.JaxRuntimeError:
            # A peer that died mid-step surfaces here as a failed collective: let the peer
            # watchdog (if the job runs one) name it and end the process, before the cleanup
            # below waits on barriers the dead peer will never reach.
            if jax.process_count() > 1:
                await_lost_peer()
            raise
        finally:
            sigterm.uninstall()
            try:
                if ckpt is not None:
                    ckpt.close()
                if summaries is not None:
                    summaries.close() if owned else summaries.flush()
            finally:
                if lock is not None:
                    lock.release()

    def _train(
        self,
        data: Any,
        init_params: Any,
        ckpt: Checkpointer,
        summaries: SummaryWriter,
        sigterm: SigtermFlag,
        on_start: Callable[[int], None] | None = None,
        frozen_params: Any = None,
    ) -> TrainResult:
        """Set-up, once: the data, the partitioned step for its shapes, the state to continue
        from (the latest checkpoint, with the data's position, or a fresh one); then the loop."""
        set_up_before = self.batch_signature is not None
        data, stateful = self._prepare_data(data)
        self._log_memory()
        state, step = self._restore_or_init(ckpt, data, stateful, init_params, frozen_params)
        if jax.process_index() == 0:  # one history: what a discarded timeline wrote after `step` moves aside
            history.supersede_after(self.config.model_dir, step)
        if on_start is not None:
            on_start(step)
        self.save_blocked_s: list = []  # seconds each save blocked the loop
        program = StepProgram(
            config=self.config,
            train_step=self.train_step,
            partitioner=self.partitioner,
            batch_signature=self.batch_signature,
            flops_per_token=model_flops_per_token(self.model, self.config.flops_per_token),
            eval_fn=self._eval_fn(state),
            step_hooks=self.step_hooks,
            hooks_take_metrics=self.hooks_take_metrics,
            batch_hooks=self.batch_hooks,
            batch_hook_every=self.batch_hook_every,
            experiment_config=self.experiment_config,
            save_blocked_s=self.save_blocked_s,
        )
        loop = TrainLoop(program, data, stateful, state, step, ckpt, summaries, sigterm, check_shapes=set_up_before)
        return loop.run()

    def _eval_fn(self, state: TrainState) -> EvalFn | None:
        """`eval_fn`, given the merged params when the state has a frozen tree (it never changes)."""
        eval_fn, frozen = self.eval_fn, state.frozen
        if eval_fn is None or frozen is None:
            return eval_fn
        return lambda params, step: eval_fn(self.eval_params(state.replace(params=params)), step)

    def _prepare_data(self, data: Any) -> tuple[Iterator[Mapping[str, Any]], bool]:
        """The data as an iterator (a tf.data one made checkpointable) and whether its position can
        be saved; sets up for its shapes unless `setup` was called before (then no batch is read)."""
        cfg = self.config
        if is_tf_iterator(data):
            data = TfDataIterator(data, cfg.model_dir, keep=(cfg.checkpoint.keep or 100) + 2)
        stateful = hasattr(data, "get_state") and hasattr(data, "set_state")
        if not stateful:
            log.warning("the data iterator has no get_state/set_state: a resumed run restarts its data")
            data = iter(data)
        if self.batch_signature is None:
            data = self._set_up_from_first_batch(data, stateful)
        return data, stateful

    def _set_up_from_first_batch(self, data: Any, stateful: bool) -> Iterator:
        """`setup` from the first batch, peeked: read, then put back (the position restored, or
        the batch chained in front) so the first step reads it again."""
        if stateful:
            start = data.get_state()
            self.setup(next(data))
            data.set_state(start)
            return data
        first = next(data)
        self.setup(first)
        return itertools.chain([first], data)

    def _restore_or_init(
        self, ckpt: Checkpointer, data: Any, stateful: bool, init_params: Any, frozen_params: Any = None
    ) -> tuple[TrainState, int]:
        """`(state, step)` of the latest usable checkpoint (the data moved to its position), else
        a fresh state (from `init_params` if given) at step 0; never a silent restart when every
        checkpoint is corrupt (`Checkpointer.restore_or_none`)."""
        found = ckpt.restore_or_none(self.abstract_state)
        if found is None:
            return self.initial_state(init_params, frozen_params), 0
        step, state, data_state, _ = found
        state = state.replace(frozen=self._frozen(frozen_params))  # checkpoints hold no frozen tree
        if self.config.offload_params:  # the device copy of the offloaded params is not saved
            state = self._attach(state)
        if stateful and data_state:
            data.set_state(data_state)
        log.info("restored step %d from %s", step, ckpt.directory)
        return state, step
