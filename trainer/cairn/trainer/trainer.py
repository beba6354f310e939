"""`Trainer`: the training loop with evaluation, checkpoints, summaries, MFU and fault handling."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import jax
import numpy as np
import optax

from cairn.partitioning import GatheredDigests, Partitioner, estimate_memory, gather_row_digests
from cairn.partitioning.peer_watchdog import await_lost_peer
from cairn.trainer.mfu import mfu as compute_mfu, peak_flops
from cairn.trainer.checkpoints import CheckpointConfig, Checkpointer, abstract_like
from cairn.trainer.data_state import TfDataIterator, is_tf_iterator
from cairn.trainer.faults import NonFiniteLossError, SigtermFlag
from cairn.trainer.lock import ModelDirLock
from cairn.trainer.model_protocol import (abstract_init, init_params, model_flops_per_token, sequences_in_batch,
                                          tokens_in_batch)
from cairn.trainer.optimizers import OptimizerConfig, as_schedule, make_optimizer
from cairn.trainer.summaries import ProgressLine, SummaryWriter
from cairn.trainer.train_state import TrainState
from cairn.trainer.train_step import (batch_shardings, make_train_step, opt_state_specs, partitioned_train_step,
                                      state_shardings)

log = logging.getLogger("cairn.trainer")
EvalFn = Callable[[Any, int], Mapping[str, Any]]
StepHook = Callable[[int, TrainState], None]
BatchHook = Callable[[int, GatheredDigests], None]


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The loop's settings. `checkpoint_every`/`eval_every`/`log_every` are in steps (0: never;
    a final checkpoint is always written). `flops_per_token` overrides the model's;
    `peak_flops` overrides the device table / CPU probe. `microbatch_reduction`: 'mean' for a
    loss that is a mean over its (micro)batch, 'sum' for one that is a sum or divided by a
    constant (t5x's loss_normalizing_factor); either way accumulation matches one full batch."""

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
    donate_state: bool = False
    handle_sigterm: bool = True
    flops_per_token: Optional[float] = None
    peak_flops: Optional[float] = None

    def __post_init__(self):
        for name in ("num_train_steps", "num_microbatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.microbatch_reduction not in ("mean", "sum"):
            raise ValueError(f"TrainerConfig.microbatch_reduction must be 'mean' or 'sum', got {self.microbatch_reduction!r}")
        for name in ("checkpoint_every", "eval_every", "log_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainerConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How `train` ended: the final step, the state, whether SIGTERM stopped it, the last metrics."""

    step: int
    state: Any
    preempted: bool
    metrics: Mapping[str, float]


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = float(v)
    return out


class Trainer:
    """Trains `model` (see `TrainableModel`) with `optimizer` on `partitioner`'s mesh.

    Args:
      model: has `init(rng, batch)` and `loss_fn(params, batch, dropout_rng)`.
      optimizer: an `OptimizerConfig`, or an optax transformation.
      learning_rate: a float or a schedule (a function of the step).
      partitioner: a `cairn.partitioning.Partitioner`.
      config: a `TrainerConfig`.
      eval_fn: `eval_fn(params, step) -> {name: value}` (or `{task: {metric: value}}`), called
        every `eval_every` steps; see `evaluator_callback`.
      experiment_config: a JSON-able dict stored in every checkpoint.
      step_hooks: functions `hook(step, state)` called in order after every train step (after
        evaluation, before SIGTERM and checkpoint handling), on every process; `state` is the
        `TrainState` after the step. A hook that runs a collective (e.g. all-gathers params)
        is called at the same step on every process.
      batch_hooks: functions `hook(step, digests)` called on every process before step `step`
        is trained, for steps that are multiples of `batch_hook_every`, with the row digests of
        its global batch gathered from every process (`cairn.partitioning.GatheredDigests`;
        `digests.fingerprint()` is the global batch's hash, independent of the host count).
        Each call costs a small all-gather, which waits for the previous step to finish.

    With several processes, the first step of every `train` call checks that hosts of one
    data-parallel replica feed identical rows (`ReplicaBatchMismatchError` otherwise).
    """

    def __init__(self, model: Any, optimizer: Union[OptimizerConfig, optax.GradientTransformation],
                 learning_rate: Union[float, Callable], partitioner: Partitioner, config: TrainerConfig,
                 eval_fn: Optional[EvalFn] = None, experiment_config: Optional[Mapping[str, Any]] = None,
                 *, step_hooks: Sequence[StepHook] = (), batch_hooks: Sequence[BatchHook] = (),
                 batch_hook_every: int = 1):
        self.model = model
        self.schedule = as_schedule(learning_rate)
        self.optimizer = make_optimizer(optimizer, learning_rate) if isinstance(optimizer, OptimizerConfig) else optimizer
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

    # -- setup ---------------------------------------------------------------------------
    def _keys(self):
        root = jax.random.PRNGKey(self.config.seed)
        return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)  # (init, dropout seed)

    def setup(self, batch: Mapping[str, Any]):
        """Abstract state, shardings, the partitioned step and the init function for this batch shape."""
        init_key, dropout_seed = self._keys()
        param_shapes, specs = abstract_init(self.model, init_key, batch)
        state_shapes = jax.eval_shape(lambda p: TrainState.create(p, self.optimizer, dropout_seed), param_shapes)
        state_sh = state_shardings(self.partitioner, state_shapes, specs, self.optimizer)
        gbatch_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            (np.shape(x)[0] * self.partitioner.data_layout().num_shards,) + np.shape(x)[1:], np.asarray(x).dtype), batch)
        batch_sh = batch_shardings(self.partitioner, gbatch_shapes)
        step_fn = make_train_step(self.model.loss_fn, self.optimizer, self.schedule, self.config.num_microbatches,
                                  self.config.microbatch_reduction)
        self.param_specs, self.state_shardings = specs, state_sh
        self.abstract_state = abstract_like(state_shapes, state_sh)
        self.train_step = partitioned_train_step(step_fn, self.partitioner, state_sh, batch_sh, self.config.donate_state)
        zeros = jax.tree.map(lambda x: np.zeros(np.shape(x), np.asarray(x).dtype), dict(batch))

        def create():
            return TrainState.create(init_params(self.model, init_key, zeros)[0], self.optimizer, dropout_seed)
        self._create = self.partitioner.partition(create, out_shardings=state_sh)
        return self.abstract_state

    def initial_state(self, params: Any = None) -> TrainState:
        """A fresh state (params from the model's init, or the given `params`, e.g. pretrained)."""
        if params is None:
            return self._create()
        _, dropout_seed = self._keys()
        params = jax.device_put(params, self.state_shardings.params)
        state = self.partitioner.partition(lambda p: TrainState.create(p, self.optimizer, dropout_seed),
                                           out_shardings=self.state_shardings)(params)
        return state

    def _log_memory(self) -> None:
        ospecs = opt_state_specs(self.optimizer, self.abstract_state.opt_state, self.abstract_state.params,
                                 self.param_specs)
        est = estimate_memory(self.abstract_state.params, self.param_specs, self.partitioner,
                              opt_state=self.abstract_state.opt_state, opt_state_specs=ospecs)
        log.info("estimated memory per device (mesh %s):\n%s", dict(self.partitioner.mesh.shape), est)
        self.memory_estimate = est

    # -- the loop ------------------------------------------------------------------------
    @staticmethod
    def _stop_requested(sigterm: SigtermFlag, step: int) -> Optional[str]:
        """Why to stop after `step` (None: go on): SIGTERM on this process or, with several
        processes, on another (the flags are all-gathered after every step, so all hosts stop at
        the same step).

        With several processes, `jax.distributed.initialize` installs JAX's own SIGTERM handler
        (its preemption notifier); `train` replaces it with ours, but a SIGTERM that arrives
        before goes to JAX, so JAX's preemption sync point is consulted too, every step."""
        if jax.process_count() > 1:
            if _any_process(sigterm.requested):
                return "SIGTERM on this process" if sigterm.requested else "SIGTERM on another process"
            return "JAX's preemption notice" if _preemption_sync_point(step) else None
        return "SIGTERM" if sigterm.requested else None

    def train(self, data: Iterator[Mapping[str, Any]], init_params: Any = None) -> TrainResult:
        """Trains to `config.num_train_steps`, resuming from the latest checkpoint in model_dir.

        `data` yields host-local numpy batches; if it has `get_state()`/`set_state(dict)` its
        position is checkpointed and restored; a tf.data iterator is checkpointed with
        `tf.train.Checkpoint` (see `TfDataIterator`). `init_params` (used only when model_dir has no
        checkpoint) starts from given params, e.g. `restore_params(...)` of a pretrained run.
        Returns at the end, or after saving when SIGTERM arrives (`preempted=True`). Raises
        `NonFiniteLossError` on a NaN/Inf loss, keeping the last good checkpoint.
        """
        cfg = self.config
        # One lock per run: process 0 holds it for every host (they share model_dir).
        lock = ModelDirLock(cfg.model_dir).acquire() if jax.process_index() == 0 else None
        sigterm = SigtermFlag().install() if cfg.handle_sigterm else SigtermFlag()
        ckpt = summaries = None
        try:
            ckpt = Checkpointer(cfg.model_dir, cfg.checkpoint)
            index, processes = jax.process_index(), jax.process_count()
            summaries = SummaryWriter(cfg.model_dir, cfg.tensorboard, primary=index == 0,
                                      log_prefix=f"process {index}/{processes}: " if processes > 1 else "")
            return self._train(data, init_params, ckpt, summaries, sigterm)
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
                    summaries.close()
            finally:
                if lock is not None:
                    lock.release()

    def _train(self, data, init_params, ckpt: Checkpointer, summaries: SummaryWriter, sigterm: SigtermFlag):
        cfg = self.config
        if is_tf_iterator(data):
            data = TfDataIterator(data, cfg.model_dir, keep=(cfg.checkpoint.keep or 100) + 2)
        stateful = hasattr(data, "get_state") and hasattr(data, "set_state")
        data = data if stateful else iter(data)
        if stateful:
            start_state = data.get_state()
            first = next(data)
            data.set_state(start_state)
        else:
            log.warning("the data iterator has no get_state/set_state: a resumed run restarts its data")
            first = next(data)
            data = itertools.chain([first], data)
        self.setup(first)
        self._log_memory()
        if ckpt.latest_step() is not None:
            step, state, data_state, _ = ckpt.restore(self.abstract_state)
            if stateful and data_state:
                data.set_state(data_state)
            log.info("restored step %d from %s", step, ckpt.directory)
        else:
            state, step = self.initial_state(init_params), 0
        flops = model_flops_per_token(self.model, cfg.flops_per_token)
        peak = cfg.peak_flops or (peak_flops(list(self.partitioner.mesh.devices.flat)) if flops else None)
        progress = ProgressLine(cfg.num_train_steps)
        last_saved = ckpt.latest_step()
        pending: list = []  # (step, metrics) not yet checked/logged
        interval_start, interval_steps, tokens, seqs = time.perf_counter(), 0, 0, 0
        last_metrics: dict = {}
        eval_metrics: dict = {}
        first_step = True
        layout = self.partitioner.data_layout()
        self.save_blocked_s: list = []  # seconds each save blocked the loop

        def check(items):
            for s, m in items:
                for name in ("loss", "grad_norm"):
                    value = float(m[name])
                    if not math.isfinite(value):
                        ckpt.wait()  # a save in flight holds an earlier, good state
                        raise NonFiniteLossError(s, value, name, ckpt.latest_step(), cfg.model_dir)

        def save(step_num, state):
            nonlocal last_saved
            check([(s, jax.device_get(m)) for s, m in pending])  # nothing non-finite gets saved
            data_state = data.get_state() if stateful else {}
            to_save = jax.tree.map(lambda x: x.copy(), state) if cfg.donate_state else state
            blocked = ckpt.save(step_num, to_save, data_state, self.experiment_config,
                                metrics={**last_metrics, **eval_metrics})
            last_saved = step_num
            self.save_blocked_s.append(blocked)
            log.info("checkpoint at step %d (blocked the loop %.3fs)", step_num, blocked)

        while step < cfg.num_train_steps:
            try:
                batch = next(data)
            except StopIteration:
                log.warning("the data ran out at step %d", step)
                break
            hooks_due = self.batch_hooks and (step + 1) % self.batch_hook_every == 0
            if hooks_due or (first_step and jax.process_count() > 1):
                digests = gather_row_digests(batch, layout)
                if first_step:
                    digests.check(step + 1)
                for batch_hook in self.batch_hooks if hooks_due else ():
                    batch_hook(step + 1, digests)
            gbatch = self.partitioner.shard_batch(batch)
            state, metrics = self.train_step(state, gbatch)
            step += 1
            if first_step:
                jax.block_until_ready(metrics)  # exclude compilation from the rates
                interval_start, first_step = time.perf_counter(), False
            else:
                interval_steps += 1
                tokens += tokens_in_batch(gbatch)
                seqs += sequences_in_batch(gbatch)
            # Check the previous step's loss now (it is done or nearly): one step of pipelining.
            check([(s, jax.device_get(m)) for s, m in pending[-1:]])
            pending.append((step, metrics))
            is_last = step == cfg.num_train_steps
            if (cfg.log_every and step % cfg.log_every == 0) or is_last or sigterm.requested:  # local flag: log early
                fetched = [(s, jax.device_get(m)) for s, m in pending]
                check(fetched)
                pending.clear()
                for s, m in fetched:
                    last_metrics = {k: float(v) for k, v in m.items()}
                    if s != step:
                        summaries.scalars("train", s, last_metrics, quiet=True)
                elapsed = time.perf_counter() - interval_start
                timing = {}
                if interval_steps and elapsed > 0:
                    timing = {"step_time_s": elapsed / interval_steps, "steps_per_second": interval_steps / elapsed,
                              "tokens_per_second": tokens / elapsed, "sequences_per_second": seqs / elapsed}
                    if flops and peak:
                        timing["mfu"] = compute_mfu(flops, tokens / elapsed, peak)
                summaries.scalars("train", step, {**last_metrics, **timing})
                progress.update(step, timing.get("steps_per_second", 0.0), f"loss {last_metrics.get('loss', 0):.4f}")
                interval_start, interval_steps, tokens, seqs = time.perf_counter(), 0, 0, 0
            if self.eval_fn is not None and cfg.eval_every and (step % cfg.eval_every == 0 or is_last):
                eval_start = time.perf_counter()
                eval_metrics = {f"eval/{k}": v for k, v in _flatten(self.eval_fn(state.params, step)).items()}
                summaries.scalars("eval", step, {k[5:]: v for k, v in eval_metrics.items()})
                interval_start += time.perf_counter() - eval_start  # evaluation is not train time
            if self.step_hooks:
                hook_start = time.perf_counter()
                for hook in self.step_hooks:
                    hook(step, state)
                interval_start += time.perf_counter() - hook_start  # hooks are not train time
            reason = self._stop_requested(sigterm, step)
            if reason:
                log.warning("%s: saving step %d and stopping", reason, step)
                save(step, state)
                ckpt.wait()
                progress.close()
                return TrainResult(step, state, True, last_metrics)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save(step, state)
        fetched = [(s, jax.device_get(m)) for s, m in pending]  # steps after the last log (data ran out)
        check(fetched)
        for s, m in fetched:
            last_metrics = {k: float(v) for k, v in m.items()}
            summaries.scalars("train", s, last_metrics, quiet=True)
        if last_saved != step:
            save(step, state)
        ckpt.wait()
        progress.close()
        return TrainResult(step, state, False, last_metrics)


def _any_process(flag: bool) -> bool:
    """True on every process if it is True on any (a tiny all-gather; multi-process runs only)."""
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.asarray([flag], np.int32))).any())


def _preemption_sync_point(step: int) -> bool:
    """JAX's preemption sync point (True on every host at one step after any got SIGTERM)."""
    from jax.experimental import multihost_utils

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # no preemption sync manager (distributed runtime without it)
        return False


def evaluator_callback(evaluator: Any, make_predict_fn: Optional[Callable] = None,
                       make_score_fn: Optional[Callable] = None) -> EvalFn:
    """An `eval_fn` from a `cairn.evaluation.Evaluator`: `make_predict_fn(params)` /
    `make_score_fn(params)` build the functions `Evaluator.evaluate` takes; returns
    `{task: {metric: value}}`."""
    def eval_fn(params, step):
        result = evaluator.evaluate(predict_fn=make_predict_fn(params) if make_predict_fn else None,
                                    score_fn=make_score_fn(params) if make_score_fn else None, step=step)
        for task, errors in result.errors.items():
            log.warning("evaluation of %s at step %d: %s", task, step, "; ".join(errors))
        return result.metrics
    return eval_fn
