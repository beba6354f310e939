"""`//launchers:train`: train the experiment `--config=launchers/configs/<exp>.py[:arg]`.

    bazel run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--config.num_train_steps=200] [--config.model_dir=/tmp/run]

Order: flags -> multi-host start-up -> validation (no compilation, nothing written; a held
lock refused here) -> the model_dir printed -> a run already in model_dir must have the same
config (else exit 2; `resume_check`, `--allow_changed=key,...`) -> data (cached in-process if
missing; the cache_dir only) -> the model_dir lock taken -> `<model_dir>/config.json` -> model,
partitioner, fingerprint header, trainer (resuming from model_dir's checkpoints) ->
post-training actions. So a run refused for its config, a changed config, its data or a held
lock leaves model_dir as it was. Exit status 0 on success, on SIGTERM (the checkpoint is
saved) and when model_dir is already at `num_train_steps`; 2 with one line on a bad or
changed config or data, a held lock, an unusable or full model_dir, a NaN/Inf loss,
checkpoints that are all corrupt, or a bucket unavailable for longer than the storage retry
budget (`CAIRN_STORAGE_RETRY_S`: the bucket, the operation and the last good checkpoint named).

`--dry_run` stops after the model and the batch's shapes (from the data spec: no batch is read):
the train step is compiled on abstract shapes (nothing allocated, nothing written to model_dir)
and its memory plan printed (`cairn.trainer.plan_memory`); exit 0, or 2 with one line (the batch
that would fit, the knobs that would help) when it does not fit the device's memory
(`--memory_limit_gib` plans against another size). On an accelerator every run prints the plan at
start-up, before training. `--dry_run --topology=v5e:2x4` plans for a TPU slice this host does
not have: the step is compiled by XLA:TPU ahead of time for the described chips (the `libtpu`
package, no TPU needed; `cairn.partitioning.topology`) and planned against their memory.
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import contextlib
import dataclasses
import errno
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import flags

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.launchers import cli, config_io, entry, multihost, optimizer_setup, resume_check, run_setup
from cairn.launchers import data as data_lib
from cairn.launchers.fingerprint import RunFingerprint, config_hash
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError
from cairn.storage import retries

log = logging.getLogger(__name__)


def _write_run_files(spec: RunSpec, fp: Any | None, tasks: Any, mesh: Mapping[str, int], step: int) -> None:
    """`config.json` (process 0) and the run fingerprint's header (None: off), its lines after
    `step` moved aside (one history): written once the trainer knows the state it trains from
    (`Trainer.train(on_start=)`), so that a refused restore leaves model_dir as it was."""
    import jax

    if jax.process_index() == 0:
        config_io.write_config_json(spec.stored, spec.keys.model_dir)
    if fp is None:
        return
    fp.supersede_after(step)
    fp.write_header(
        config_hash=config_hash(config_io.hashable_config(spec.stored)),
        data_fingerprint=data_lib.data_fingerprint(spec.reader, tasks),
        seed=int(spec.keys.seed),
        process_count=jax.process_count(),
        device_count=jax.device_count(),
        mesh=dict(mesh),
    )


@contextlib.contextmanager
def _model_dir_lock(model_dir: str):
    """The model_dir lock, taken by process 0 (every process stops if it is refused) and held
    until the run ends (handed to `Trainer.train`)."""
    import jax

    from cairn.trainer import ModelDirLock, ModelDirLockedError

    lock: ModelDirLock | None = None
    error: Exception | None = None
    if jax.process_index() == 0:
        try:
            lock = ModelDirLock(model_dir).acquire()
        except ModelDirLockedError as e:
            error = e
        except OSError as e:  # the first write: a model_dir the start-up probe could not rule out
            error = ConfigError("model_dir", f"directory {model_dir}: cannot write ({e.strerror or e})")
    multihost.stop_together(error, "taking the model_dir lock")
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def train(
    spec: RunSpec,
    out: Callable[[str], None] = print,
    restart_if_corrupt: bool = False,
    dry_run: bool = False,
    memory_limit_bytes: int | None = None,
    devices: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Runs the experiment of `spec` (`cli.loaded_config`'s). Returns `{"result", "post"}`; raises `ConfigError`.
    `restart_if_corrupt`: when every checkpoint is corrupt, move them aside and start from step
    0 (else `AllCheckpointsCorruptError`). `dry_run`: only the memory plan (`{"plan"}`; raises
    `StepDoesNotFitError` when the step does not fit), nothing written to model_dir.
    `memory_limit_bytes`: the device memory to plan against (default: the device's own).
    `devices`: with `dry_run`, plan for these instead of `jax.devices()` (a TPU slice's
    `topology_devices`: compiled for them ahead of time)."""
    if devices is not None and not dry_run:
        raise ValueError("train: devices other than this host's are for dry_run (a plan compiled ahead of time)")
    with contextlib.ExitStack() as held:
        return _train(spec, out, held, restart_if_corrupt, dry_run, memory_limit_bytes, devices)


def plan(trainer: Any, first_batch: Any, out: Callable[[str], None], limit_bytes: int | None, strict: bool) -> Any:
    """The step's memory plan, printed; when it does not fit, `StepDoesNotFitError` if `strict` or
    XLA refused to compile it (training could not start), else the one line as a warning."""
    from cairn.trainer import StepDoesNotFitError, plan_memory

    memory = plan_memory(trainer, first_batch, limit_bytes=limit_bytes)
    refused = memory.fits is False and (strict or memory.step.compile_error is not None)
    out(memory.summary(error=not refused))  # refused: the error's one line follows on stderr
    if refused:
        raise StepDoesNotFitError(memory)
    if memory.fits is False:
        log.warning("%s", memory.error())
    return memory


def _train(
    spec: RunSpec,
    out: Callable[[str], None],
    held: contextlib.ExitStack,
    restart_if_corrupt: bool,
    dry_run: bool = False,
    memory_limit_bytes: int | None = None,
    devices: Sequence[Any] | None = None,
) -> dict[str, Any]:
    import jax

    from cairn.launchers import builder, post_training
    from cairn.partitioning import platform

    keys = spec.keys
    start = time.perf_counter()
    with data_lib.source_errors_as_data_errors(keys.data.task, keys.data.split):
        ready = run_setup.prepare(spec, devices=devices)
        tasks, partitioner = ready.tasks, ready.partitioner
        out(f"model_dir: {keys.model_dir}")
        if devices is not None:  # programs from here on are built for the described devices
            held.enter_context(platform.for_devices(devices))
        error = None
        if jax.process_index() == 0:
            try:
                resume_check.check(spec.stored, spec.plain, raw=cli.raw_config())  # before config.json is rewritten
            except ConfigError as e:
                error = e
        multihost.stop_together(error, "comparing model_dir's config.json")
        reader = data_lib.make_train_data(spec.reader, partitioner, tasks)  # data errors: nothing written yet
    model = builder.load_model(spec)
    trainable = builder.trainable_model(spec, model)  # the model, or LoRA adapters or a prompt over it
    first = data_lib.batch_signature(reader)  # from the spec: no batch is read to learn shapes
    if dry_run:  # the plan, then stop: no lock, nothing written
        trainer = builder.make_trainer(spec, trainable, partitioner)
        optimizer_setup.check_param_patterns(spec.optimizer, trainer, first)  # optimizer.* and model.lora
        return {"plan": plan(trainer, first, out, memory_limit_bytes, strict=True)}
    evaluator = builder.make_evaluator(spec, decode=keys.eval.decode_metrics) if ready.eval_tasks else None
    eval_fn = (
        builder.make_eval_fn(spec, model, evaluator, partitioner) if (evaluator and keys.trainer.eval_every) else None
    )
    # the fingerprint's hooks; its header and config.json are written by `on_start` below
    fp = RunFingerprint(keys.model_dir, checksum_every=keys.fingerprint_every) if keys.fingerprint_every else None
    trainer = builder.make_trainer(
        spec,
        trainable,
        partitioner,
        eval_fn,
        step_hooks=(fp.step_hook,) if fp else (),
        batch_hooks=(fp.batch_hook,) if fp else (),
    )
    optimizer_setup.check_param_patterns(spec.optimizer, trainer, first)  # on the params the trainer sets up
    trainer.setup(first)  # its shapes from the spec: `train` reads no batch ahead (the first must match)
    lock = held.enter_context(_model_dir_lock(keys.model_dir))  # then the lock, before the first write
    if restart_if_corrupt:
        checkpoint = dataclasses.replace(trainer.config.checkpoint, restart_if_corrupt=True)
        trainer.config = dataclasses.replace(trainer.config, checkpoint=checkpoint)
    if jax.default_backend() != "cpu" or memory_limit_bytes is not None:  # before training: the plan
        plan(trainer, first, out, memory_limit_bytes, strict=False)
    init = frozen = None
    source = builder.init_source(spec)
    if source and spec.lora is not None:
        frozen = builder.base_params(spec, trainer, first)
        out(f"LoRA rank {spec.lora.rank} adapters of {source} (the frozen base; checkpoints hold the adapters)")
    elif source and spec.prompt_tuning is not None:
        frozen = builder.base_params(spec, trainer, first)
        init = builder.initial_prompt(spec, trainer, frozen)
        pt = spec.prompt_tuning
        what = f"a {pt.length}-embedding prompt ({pt.init}) for {source}"
        out(f"prompt tuning: {what} (the frozen base; checkpoints hold the prompt)")
    elif source:
        init = builder.pretrained_params(spec, trainer, first)
        how = "upcycled from " if keys.init.upcycle_from else "from "
        out(f"initial params {how}{source} (used unless model_dir has a checkpoint)")
    summaries = trainer.make_summaries()  # open past the last step: the final evaluation goes there too
    try:
        result = trainer.train(
            reader,
            init_params=init,
            summaries=summaries,
            model_dir_lock=lock,
            on_start=lambda step: _write_run_files(spec, fp, tasks, ready.mesh, step),
            frozen_params=frozen,
        )
        trained_s = time.perf_counter() - start
        post = {}
        if not result.preempted:
            every = keys.trainer.eval_every
            evaluated = eval_fn is not None and (result.step % every == 0 or result.step == keys.num_train_steps)
            record = None if evaluated else summaries.scalars  # the loop's eval_fn wrote this step already
            post = post_training.run(
                spec,
                model,
                trainer.eval_params(result.state),  # on the device; a LoRA run's adapters folded in, a prompt put in
                evaluator,
                result.step,
                partitioner,
                out,
                record,
            )
    finally:
        summaries.close()
    post_training.summary(keys, result, trained_s, time.perf_counter() - start, out)
    return {"result": result, "post": post}


def _main(spec: RunSpec) -> None:
    from cairn.partitioning import gpu_flags

    gpu_flags.set_gpu_xla_flags()  # on a GPU, before JAX starts a backend (XLA reads XLA_FLAGS once)

    from cairn.trainer.faults import StorageWriteError, write_failure, write_failure_code
    from cairn.trainer.manifests import last_good_step
    from cairn.trainer.save_failures import quiet_failed_save_logs

    if not entry.VERBOSE.value:  # orbax's tracebacks of a write the storage refused: our one line says it
        quiet_failed_save_logs()
    try:
        storage.retry_budget()  # CAIRN_STORAGE_RETRY_S checked before anything starts
    except ValueError as e:
        raise entry.UsageError(str(e)) from None
    try:
        limit = flags.FLAGS.memory_limit_gib
        if limit is not None and limit <= 0:
            raise entry.UsageError(f"--memory_limit_gib must be > 0, got {limit}")
        devices = described_devices(
            flags.FLAGS.topology, flags.FLAGS.dry_run, run_setup.print_on_process_0, spec.mesh.num_slices
        )
        train(
            spec,
            out=run_setup.print_on_process_0,
            restart_if_corrupt=flags.FLAGS.restart_if_corrupt,
            dry_run=flags.FLAGS.dry_run,
            memory_limit_bytes=None if limit is None else int(limit * 2**30),
            devices=devices,
        )
    except storage.StorageUnavailableError as e:  # the bucket stayed down past the retry budget
        from cairn.trainer.checkpoints import last_committed
        from cairn.trainer.faults import StorageOutageError

        model_dir = spec.keys.model_dir
        raise StorageOutageError(retries.declared_outage() or e, model_dir, last_committed(model_dir)) from e
    except OSError as e:  # a write refused outside a checkpoint save (metrics, config.json)
        code = None if isinstance(e, StorageWriteError) else write_failure_code(e)
        model_dir = spec.keys.model_dir
        if code is None or not _in_model_dir(e.filename, model_dir, code):
            raise
        what = e.filename or "the run files"
        raise write_failure(model_dir, f"{what}", last_good_step(model_dir), code) from e


def described_devices(
    name: str | None, dry_run: bool, out: Callable[[str], None], num_slices: int = 1
) -> list[Any] | None:
    """The devices of `--topology` (None without it): `num_slices` of that slice (the config's
    `partitioning.num_slices`), described by libtpu for an ahead-of-time compile;
    `entry.UsageError` (one line) without `--dry_run`, for a name that does not parse, or
    without libtpu."""
    if name is None:
        return None
    from cairn.partitioning import topology

    if not dry_run:
        raise entry.UsageError(f"--topology={name} plans for a TPU slice this host does not have: add --dry_run")
    try:
        devices = topology.topology_devices(name, num_slices=num_slices)
    except topology.TopologyError as e:
        raise entry.UsageError(f"--topology: {e}") from None
    hosts = topology.process_count(devices)
    slices = f" x {num_slices} slices" if num_slices > 1 else ""
    out(
        f"planning for TPU {name}{slices}: {len(devices)} x {devices[0].device_kind} on {hosts} host"
        f"{'s' if hosts > 1 else ''}, compiled ahead of time by XLA:TPU on this host (nothing runs)"
    )
    return devices


def _in_model_dir(filename: Any, model_dir: str, code: int) -> bool:
    """Whether a refused write is the run's own: out of space or over a size limit, always; a
    permission or read-only error, only when it names a file under model_dir."""
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    if not isinstance(filename, str):
        return False
    if storage.is_url(str(model_dir)):
        return filename.startswith(str(model_dir).rstrip("/") + "/")
    return os.path.abspath(filename).startswith(os.path.join(os.path.abspath(model_dir), ""))


def run() -> None:
    """The program: `train(config)`; bad data, a locked model_dir, unusable, full or unavailable
    storage, a NaN/Inf loss or checkpoints that are all corrupt exit 2 with one line."""
    # The program's own flags, defined when it runs: importing this module defines none.
    flags.DEFINE_bool(
        "restart_if_corrupt",
        False,
        "When every checkpoint in model_dir is corrupt, move them to corrupt_checkpoints/ and train "
        "from step 0 (default: exit 2 naming them).",
    )
    flags.DEFINE_bool(
        "dry_run",
        False,
        "Compile the train step on abstract shapes, print its memory plan and exit (0; 2 with one line "
        "when it does not fit the device's memory), without training or writing to model_dir.",
    )
    flags.DEFINE_string(
        "topology",
        None,
        "With --dry_run: plan for this TPU slice instead of this host's devices (e.g. v5e:1x1, v5e:2x4, "
        "v4:2x2x1), compiled ahead of time by XLA:TPU (needs the libtpu package, not a TPU).",
    )
    flags.DEFINE_float(
        "memory_limit_gib",
        None,
        "Plan the step's memory against this many GiB of device memory instead of the device's own "
        "(with --dry_run; or printed at start-up like on an accelerator).",
        lower_bound=0.0,
    )
    # The trainer's errors by name: a bad config is refused before JAX or the trainer is imported.
    expected = (
        DataTasksError,
        "cairn.trainer.lock.ModelDirLockedError",
        storage.StorageError,
        "cairn.trainer.faults.NonFiniteLossError",
        "cairn.trainer.checkpoints.AllCheckpointsCorruptError",
        "cairn.trainer.memory_plan.StepDoesNotFitError",
    )
    cli.run_entry_point(_main, expected=expected, logs=cli.quiet_logs)


if __name__ == "__main__":
    entry.main(run)
