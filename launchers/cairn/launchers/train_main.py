"""`//launchers:train`: train the experiment `--config=launchers/configs/<exp>.py[:arg]`.

    bazel run //launchers:train -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--config.num_train_steps=200] [--config.model_dir=/tmp/run]

Order: flags -> multi-host start-up -> validation (no compilation, nothing written) ->
the model_dir printed -> a run already in model_dir must have the same config (else exit 2;
`resume_check`, `--allow_changed=key,...`) -> `<model_dir>/config.json` -> data (cached
in-process if missing) -> model, partitioner, trainer (resuming from model_dir's checkpoints)
-> post-training actions. Exit status 0 on success, on SIGTERM (the checkpoint is saved) and
when model_dir is already at `num_train_steps`; 2 on a bad config.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ml_collections

from cairn.launchers import builder, cli, config_io, multihost, post_training, resume_check, validation
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)


def prepare(config: ml_collections.ConfigDict, batch_keys: tuple[str, ...] = ("data.batch_size",)) -> dict[str, Any]:
    """Joins the job and validates everything before anything is compiled or written; the
    batch sizes at `batch_keys` (those the caller uses) are checked against the mesh's data
    shards. Returns `{"vocabulary", "tasks", "eval_tasks", "mesh", "partitioner", "model_config",
    "schedule"}`: the network config and the learning-rate schedule built while checking, for
    `builder.load_model(..., net=)` and `builder.make_trainer(..., schedule=)`."""
    import jax

    preset = validation.check_static(config)
    multihost.initialize(config)
    multihost.check_same_config(config)
    check_model_dir(config)
    vocabulary = data_lib.make_vocabulary(config)
    data_lib.register_tasks(config, vocabulary)
    tasks = data_lib.get_tasks(config, "data.task")
    eval_tasks = (
        data_lib.get_tasks(config, "eval.task")
        if (config.post_training.final_eval or config.trainer.eval_every)
        else {}
    )
    validation.check_data(config, {**tasks, **eval_tasks})
    net = builder.model_config(config, vocabulary, preset=preset)  # vocab size against the vocabulary
    mesh = validation.check_mesh(config, jax.device_count(), jax.process_count())
    partitioner = builder.make_partitioner(config)
    parts, shards = partitioner.batch_parts(), partitioner.data_layout().num_shards
    for key in batch_keys:
        validation.check_batch_size(config, key, parts, shards, mesh, jax.process_count())
    schedule = builder.make_schedule(config)  # schedule arguments
    return {
        "vocabulary": vocabulary,
        "tasks": tasks,
        "eval_tasks": eval_tasks,
        "mesh": mesh,
        "partitioner": partitioner,
        "model_config": net,
        "schedule": schedule,
    }


def check_model_dir(config: ml_collections.ConfigDict) -> None:
    """Every process can write `model_dir` (local, or a bucket: it exists, the endpoint answers,
    the credentials allow writing), else a `ConfigError` naming the URL and the cause; and no
    live run holds its lock (`ModelDirLockedError`), checked before anything is written."""
    import jax

    from cairn import storage
    from cairn.trainer import ModelDirLock

    error: Exception | None = None
    try:
        storage.check_writable(config.model_dir)
        if jax.process_index() == 0:
            ModelDirLock(config.model_dir).check_free()  # before config.json is rewritten
    except storage.StorageError as e:
        error = ConfigError("model_dir", str(e))
    except Exception as e:
        error = e
    multihost.stop_together(error, "checking model_dir")


def _fingerprint(config: ml_collections.ConfigDict, tasks: Any, mesh: dict) -> Any | None:
    """Writes the run fingerprint's header; returns the `RunFingerprint` (None when off)."""
    if not config.fingerprint_every:
        return None
    import jax

    from cairn.launchers.fingerprint import RunFingerprint, config_hash

    fp = RunFingerprint(config.model_dir, checksum_every=config.fingerprint_every)
    fp.write_header(
        config_hash=config_hash(config_io.hashable_config(config)),
        data_fingerprint=data_lib.data_fingerprint(config, tasks),
        seed=int(config.seed),
        process_count=jax.process_count(),
        device_count=jax.device_count(),
        mesh=dict(mesh),
    )
    return fp


def train(config: ml_collections.ConfigDict, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the experiment (validated first). Returns `{"result", "post"}`; raises `ConfigError`."""
    import jax

    start = time.perf_counter()
    ready = prepare(config)
    vocabulary, tasks = ready["vocabulary"], ready["tasks"]
    out(f"model_dir: {config.model_dir}")
    error = None
    if jax.process_index() == 0:
        try:
            resume_check.check(config, raw=cli.raw_config())  # before config.json is rewritten
        except ConfigError as e:
            error = e
    multihost.stop_together(error, "comparing model_dir's config.json")
    if jax.process_index() == 0:
        config_io.write_config_json(config)
    partitioner = ready["partitioner"]
    reader = data_lib.make_train_data(config, partitioner, tasks)
    model = builder.load_model(config, vocabulary, net=ready["model_config"])
    evaluator = builder.make_evaluator(config) if ready["eval_tasks"] else None
    eval_fn = (
        builder.make_eval_fn(config, model, evaluator, partitioner)
        if (evaluator and config.trainer.eval_every)
        else None
    )
    fp = _fingerprint(config, tasks, ready["mesh"])
    trainer = builder.make_trainer(
        config,
        model,
        partitioner,
        eval_fn,
        step_hooks=(fp.step_hook,) if fp else (),
        batch_hooks=(fp.batch_hook,) if fp else (),
        schedule=ready["schedule"],
    )
    init = None
    if config.init.checkpoint or config.init.hf_checkpoint:
        state = reader.get_state()
        first = next(reader)
        reader.set_state(state)
        init = builder.pretrained_params(config, trainer, first)
        source = config.init.checkpoint or config.init.hf_checkpoint
        out(f"initial params from {source} (used unless model_dir has a checkpoint)")
    result = trainer.train(reader, init_params=init)
    if "loss" not in result.metrics and not result.preempted:
        out(f"already at step {result.step} of {config.num_train_steps}: nothing to train")
    else:
        loss = f"; loss {result.metrics['loss']:.4f}" if "loss" in result.metrics else ""
        out(
            f"trained to step {result.step} in {time.perf_counter() - start:.1f}s"
            f"{' (preempted: checkpoint saved)' if result.preempted else ''}{loss}"
        )
    post = {}
    if not result.preempted:
        post = post_training.run(
            config, model, result.state.params, vocabulary, evaluator, result.step, out, partitioner=partitioner
        )
    out(f"model_dir: {config.model_dir}")
    return {"result": result, "post": post}


def print_on_process_0(text: str) -> None:
    """Prints on process 0 only (every process computes the same evaluation and samples).
    Called only after the multi-host start-up."""
    import jax

    if jax.process_index() == 0:
        print(text, flush=True)


def quiet_logs() -> None:
    """cairn's own INFO logs (progress, metrics, checkpoints); only warnings from the rest
    (orbax logs every file it writes at INFO)."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("cairn").setLevel(logging.INFO)


def _main(config: ml_collections.ConfigDict) -> None:
    train(config, out=print_on_process_0)


def run() -> None:
    """The program: `train(config)`; bad data, a locked model_dir or unusable storage exit 2."""
    from cairn import storage
    from cairn.datatasks import DataTasksError
    from cairn.trainer import ModelDirLockedError

    cli.run_entry_point(_main, expected=(DataTasksError, ModelDirLockedError, storage.StorageError), logs=quiet_logs)


if __name__ == "__main__":
    run()
