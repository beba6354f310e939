"""The body of `Trainer.train`, told as the story of one step: read the batch, train on it, log,
evaluate, run the step hooks, then stop (saving) on SIGTERM or save when a checkpoint is due.

`Trainer.train` sets up once (the data, the partitioned step, the state to continue from) and
hands a `TrainLoop` what it set up, as a `StepProgram` (the loop never imports the trainer
module: the dependency runs one way). The loop's running figures live in `loop_metrics`:
`PendingMetrics` (step metrics still on the device, checked for NaN/Inf one step late) and
`Rates` (train time, tokens and sequences, for the rates and MFU).

Metrics are never lost: every step's row reaches the JSON lines, whichever way the loop ends
(the last step, the data running out, SIGTERM, a NaN/Inf loss, an error, a peer watchdog ending
the process for a lost peer), and the writers are flushed then. Each checkpoint save first makes
every row up to its step durable (recorded and flushed before the save can commit), so a process
killed at any moment after a commit has lost no row its resume will not retrain. The console
(`cairn.trainer.console`) shows the progress on a time interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from cairn.partitioning import gather_row_digests, peer_watchdog
from cairn.trainer.checkpoints import Checkpointer
from cairn.trainer.console import PROGRESS_METRICS, Console
from cairn.trainer.faults import SigtermFlag, stop_reason
from cairn.trainer.loop_metrics import PendingMetrics, Rates, StepMetrics
from cairn.trainer.mfu import peak_flops
from cairn.trainer.model_protocol import batch_signature
from cairn.trainer.param_offload import params_on_device
from cairn.trainer.summaries import SummaryWriter

log = logging.getLogger("cairn.trainer")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How `train` ended: the final step, the state, whether SIGTERM stopped it, the last metrics."""

    step: int
    state: Any
    preempted: bool
    metrics: Mapping[str, float]


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict:
    """`{task: {metric: value}}` (any depth) as `{"task/metric": float}`."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, Mapping):
            out.update(flatten_metrics(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = float(v)
    return out


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """What the loop runs, handed over by `Trainer.train` (the loop never sees the trainer):
    the trainer's config, its compiled step and the partitioner it shards batches with, the
    batch signature it was set up for, the model's FLOPs per token (None: no rates), the
    evaluation and hooks, the experiment config saved with each checkpoint, and the list each
    save's blocking seconds are appended to."""

    config: Any  # TrainerConfig
    train_step: Callable[..., Any]
    partitioner: Any
    batch_signature: Any
    flops_per_token: float | None
    eval_fn: Callable[..., Any] | None
    step_hooks: Sequence[Callable[..., Any]]
    hooks_take_metrics: Sequence[bool]
    batch_hooks: Sequence[Callable[..., Any]]
    batch_hook_every: int
    experiment_config: Mapping[str, Any]
    save_blocked_s: list[float]


class TrainLoop:
    """Trains `program`'s step from `state` at `step` up to `num_train_steps`, until the data
    runs out, or until a stop is requested (then saved); in lockstep on every process.
    `check_shapes`: the trainer was set up before `train` (no batch was peeked), so the first
    batch must match the one `Trainer.setup` was given."""

    def __init__(
        self,
        program: StepProgram,
        data: Any,  # an iterator of batches; with get_state/set_state when `stateful`
        stateful: bool,
        state: Any,
        step: int,
        ckpt: Checkpointer,
        summaries: SummaryWriter,
        sigterm: SigtermFlag,
        check_shapes: bool = False,
    ):
        cfg = self.cfg = program.config
        self.program, self.data, self.stateful, self.check_shapes = program, data, stateful, check_shapes
        self.state, self.step = state, step
        self.ckpt, self.summaries, self.sigterm = ckpt, summaries, sigterm
        flops = program.flops_per_token
        peak = cfg.peak_flops or (peak_flops(list(program.partitioner.mesh.devices.flat)) if flops else None)
        self.console = Console(
            cfg.num_train_steps, enabled=cfg.progress and summaries.primary, interval_s=cfg.progress_interval_s
        )
        self.last_saved = ckpt.latest_step()
        self.pending = PendingMetrics(ckpt, cfg.model_dir, self.record)
        self.writing = threading.Lock()  # rows are written by this loop, or by a watchdog ending the process
        self.rates = Rates(flops, peak)  # since the last log
        self.overall = Rates(flops, peak)  # since the first step: the console's rates and ETA
        self.last_metrics: dict = {}
        self.last_step: int | None = None  # the step of `last_metrics`
        self.step_metrics: Any = None  # this step's metrics, on the device
        self.eval_metrics: dict = {}
        self.first_step = True  # the first step of this `train` call
        self.layout = program.partitioner.data_layout()

    def run(self) -> TrainResult:
        """Each step: get the batch, train, log, show progress, evaluate, step hooks, stop or
        save. On an error the pending steps' metrics are recorded before it propagates; a peer
        watchdog that ends the process records the steps whose metrics are computed."""
        unhook = peer_watchdog.on_stop(self.record_on_stop)
        try:
            while self.step < self.cfg.num_train_steps:
                self.ckpt.raise_if_failed()  # a failed background save (a full disk) stops the run now
                batch = self.next_batch()
                if batch is None:
                    break
                self.train_on(batch)
                self.log_if_due()
                self.show_progress()
                self.evaluate_if_due()
                self.run_step_hooks()
                reason = stop_reason(self.sigterm, self.step)
                if reason:
                    return self.stop(reason)
                self.save_if_due()
            return self.finish()
        except BaseException:
            self.pending.salvage()
            raise
        finally:
            unhook()
            self.console.close()
            self.summaries.flush()

    # -- the step ------------------------------------------------------------------------
    def next_batch(self) -> Mapping[str, Any] | None:
        """The next host-local batch (one read per step); None when the data ran out."""
        try:
            batch = next(self.data)
        except StopIteration:
            log.warning("the data ran out at step %d", self.step)
            return None
        if self.first_step and self.check_shapes and batch_signature(batch) != self.program.batch_signature:
            raise ValueError(
                f"the data's batches {batch_signature(batch)} differ from the batch the trainer was "
                f"set up for {self.program.batch_signature} (Trainer.setup)"
            )
        return batch

    def train_on(self, batch: Mapping[str, Any]) -> None:
        """Batch hooks, then one train step; meanwhile the previous step's loss is checked."""
        self.run_batch_hooks(batch)
        global_batch = self.program.partitioner.shard_batch(batch)
        self.state, metrics = self.program.train_step(self.state, global_batch)
        self.step += 1
        if self.first_step:
            jax.block_until_ready(metrics)  # exclude compilation from the rates
            self.rates.restart()
            self.overall.restart()
            self.first_step = False
        else:
            self.rates.count(global_batch)
            self.overall.count(global_batch)
        self.step_metrics = metrics
        self.pending.check_latest()  # the previous step: done or nearly
        self.pending.add(self.step, metrics)

    def run_batch_hooks(self, batch: Mapping[str, Any]) -> None:
        """Before step `step + 1`: the global batch's row digests, gathered when batch hooks are
        due or, on the first step with several processes, to check replicas feed identical rows."""
        program, step = self.program, self.step + 1
        hooks_due = bool(program.batch_hooks) and step % program.batch_hook_every == 0
        if not (hooks_due or (self.first_step and jax.process_count() > 1)):
            return
        digests = gather_row_digests(batch, self.layout)
        if self.first_step:
            digests.check(step)
        for hook in program.batch_hooks if hooks_due else ():
            hook(step, digests)

    def log_if_due(self) -> None:
        """Every `log_every` steps, at the last step, and as soon as SIGTERM arrives here: every
        pending step's metrics to the JSON lines, this step's with the rates to the log."""
        cfg, step = self.cfg, self.step
        if not (
            (cfg.log_every and step % cfg.log_every == 0) or step == cfg.num_train_steps or self.sigterm.requested
        ):  # the local flag: log early
            return
        self.record(self.pending.take(), logged_step=step)
        timing = self.rates.timing()
        self.summaries.scalars("train", step, {**self.last_metrics, **timing})
        self.rates.restart()

    def show_progress(self) -> None:
        """The console's line when its interval has passed, and at the last step: the latest
        checked step's loss and learning rate, the rates since the first step."""
        last = self.step == self.cfg.num_train_steps
        if not (last or self.console.due()):
            return
        timing = self.overall.timing()  # empty after the first step (compilation): nothing to show yet
        if not (last or timing):
            return
        latest = self.last_metrics if self.last_step == self.step else self.pending.latest
        values = {k: float(latest[k]) for k in PROGRESS_METRICS if k in latest}
        self.console.update(self.step, {**values, **timing}, force=last)

    def record(self, fetched: list[tuple[int, Mapping[str, Any]]], logged_step: int | None = None) -> None:
        """Keeps the latest metrics; JSON rows (quiet) for every step but `logged_step`."""
        with self.writing:
            self._write_rows(fetched, logged_step)

    def _write_rows(self, fetched: list[tuple[int, Mapping[str, Any]]], logged_step: int | None) -> None:
        for step, metrics in fetched:
            self.last_metrics = {k: float(v) for k, v in metrics.items()}
            self.last_step = step
            if step != logged_step:
                self.summaries.scalars("train", step, self.last_metrics, quiet=True)

    def record_on_stop(self) -> None:
        """A peer watchdog is ending this process (a lost peer; this runs on its thread while the
        loop may be blocked in a collective): records and flushes the pending steps whose metrics
        are computed, those before the first NaN/Inf. Waits at most a few seconds for a write in
        progress on the loop's thread."""
        if not self.writing.acquire(timeout=10):
            return
        try:
            self._write_rows(self.pending.take_ready(), None)
            self.summaries.flush()
        finally:
            self.writing.release()

    def evaluate_if_due(self) -> None:
        """`eval_fn` every `eval_every` steps and at the last step (not train time)."""
        eval_fn, cfg, step = self.program.eval_fn, self.cfg, self.step
        if eval_fn is None or not cfg.eval_every or not (step % cfg.eval_every == 0 or step == cfg.num_train_steps):
            return
        with self.paused():
            metrics = flatten_metrics(eval_fn(params_on_device(self.state.params), step))
            self.eval_metrics = {f"eval/{k}": v for k, v in metrics.items()}
            self.summaries.scalars("eval", step, metrics)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is not train time (for either rate)."""
        with self.rates.paused(), self.overall.paused():
            yield

    def run_step_hooks(self) -> None:
        """Each hook in order, every step (not train time): `hook(step, state)`, or
        `hook(step, state, metrics)` for a hook taking three arguments, `metrics` this step's
        `StepMetrics` (fetched from the device only if the hook reads them)."""
        if not self.program.step_hooks:
            return
        metrics = StepMetrics(self.step_metrics)
        with self.paused():
            hook: Any
            for hook, takes_metrics in zip(self.program.step_hooks, self.program.hooks_take_metrics):
                if takes_metrics:
                    hook(self.step, self.state, metrics)
                else:
                    hook(self.step, self.state)

    # -- saving and the end ----------------------------------------------------------------
    def save_if_due(self) -> None:
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save()

    def save(self) -> None:
        """Saves this step with the data's position. Every pending step's metrics are checked
        first (nothing non-finite gets saved) and their rows written and flushed: when the
        checkpoint commits, every row up to its step is durable."""
        self.record(self.pending.take())
        self.summaries.flush()
        data_state = self.data.get_state() if self.stateful else {}
        state = jax.tree.map(lambda x: x.copy(), self.state) if self.cfg.donate_state else self.state
        blocked = self.ckpt.save(
            self.step,
            state,
            data_state,
            self.program.experiment_config,
            metrics={**self.last_metrics, **self.eval_metrics},
        )
        self.last_saved = self.step
        self.program.save_blocked_s.append(blocked)
        log.info("checkpoint at step %d (blocked the loop %.3fs)", self.step, blocked)

    def stop(self, reason: str) -> TrainResult:
        """Saves this step and stops (preempted)."""
        log.warning("%s: saving step %d and stopping", reason, self.step)
        self.save()
        return self.close(preempted=True)

    def finish(self) -> TrainResult:
        """A final save if needed (the data ran out after the last save)."""
        if self.last_saved != self.step:
            self.save()
        return self.close(preempted=False)

    def close(self, preempted: bool) -> TrainResult:
        """Records the metrics of the steps after the last log and flushes every writer."""
        self.record(self.pending.take())
        self.summaries.flush()
        self.ckpt.wait()
        return TrainResult(self.step, self.state, preempted, self.last_metrics)
