"""Start-up shared by the train, eval and infer entry points, on one process or many: join
the job, validate everything a run uses before anything is compiled or written (`prepare`,
returning a typed `RunSetup`), check `model_dir`, and let process 0 take the decisions that
depend on files (which checkpoint, which chunks are missing) so that every process runs the
same collectives. No entry point imports another: each imports this module. JAX is imported
inside the functions, so that a config refused by `validation.check_static` costs no JAX
import (tests/launchers/entry_test.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from cairn import storage
from cairn.launchers import data as data_lib
from cairn.launchers import multihost, validation
from cairn.launchers.validation import ConfigError


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What `prepare` built while validating: the vocabulary, the training and evaluation
    tasks (by name), the mesh (axis name -> size), the partitioner, the network config (for
    `builder.load_model(..., net=)`) and the learning-rate schedule (for
    `builder.make_trainer(..., schedule=)`)."""

    vocabulary: Any
    tasks: Mapping[str, Any]
    eval_tasks: Mapping[str, Any]
    mesh: Mapping[str, int]
    partitioner: Any
    model_config: Any
    schedule: Any


def prepare(
    config: ml_collections.ConfigDict,
    batch_keys: tuple[str, ...] = ("data.batch_size",),
    eval_task: bool = False,
) -> RunSetup:
    """Joins the job and validates everything before anything is compiled or written; the
    batch sizes at `batch_keys` (those the caller uses: eval and infer pass none and check their
    own, `check_padded_batch_size`) are checked against the mesh's data shards. The
    evaluation task is looked up and checked when the training config evaluates, or with
    `eval_task`."""
    import jax

    from cairn.launchers import builder

    preset = validation.check_static(config)
    multihost.initialize(config)
    multihost.check_same_config(config)
    check_model_dir(config)
    vocabulary = data_lib.make_vocabulary(config)
    data_lib.register_tasks(config, vocabulary)
    tasks = data_lib.get_tasks(config, "data.task")
    evaluates = eval_task or config.post_training.final_eval or config.trainer.eval_every
    eval_tasks = data_lib.get_tasks(config, "eval.task") if evaluates else {}
    validation.check_data(config, {**tasks, **eval_tasks})
    net = builder.model_config(config, vocabulary, preset=preset)  # vocab size against the vocabulary
    mesh = validation.check_mesh(config, jax.device_count(), jax.process_count())
    partitioner = builder.make_partitioner(config)
    parts, shards = partitioner.batch_parts(), partitioner.data_layout().num_shards
    for key in batch_keys:
        validation.check_config_batch_size(config, key, parts, shards, mesh, jax.process_count())
    schedule = builder.make_schedule(config)  # schedule arguments
    return RunSetup(vocabulary, tasks, eval_tasks, mesh, partitioner, net, schedule)


def check_padded_batch_size(key: str, size: int, partitioner: Any) -> None:
    """`validation.check_batch_size` of an eval or infer batch of `size` rows (named `key`) on
    `partitioner`'s mesh: only the hosts' data shards count, as `ShardedBatches` pads a batch to
    the data-parallel devices."""
    import jax

    shards = partitioner.data_layout().num_shards
    validation.check_batch_size(key, size, shards, partitioner.mesh.shape, jax.process_count())


def check_model_dir(config: ml_collections.ConfigDict) -> None:
    """Every process can write `model_dir` (local, or a bucket: it exists, the endpoint answers,
    the credentials allow writing), else a `ConfigError` naming the URL and the cause; and no
    live run holds its lock (`ModelDirLockedError`), checked before anything is written."""
    import jax

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


def is_process_0() -> bool:
    """Whether this is the process that writes files and prints."""
    import jax

    return jax.process_index() == 0


def print_on_process_0(text: str) -> None:
    """Prints (flushed) on process 0 only (every process computes the same evaluations and
    samples). Called only after the multi-host start-up."""
    if is_process_0():
        print(text, flush=True)


def from_process_0(decide: Callable[[], Sequence[int]]) -> list[int]:
    """`decide()` (a list of ints) run on process 0 only, its result given to every process.

    A `ConfigError` raised by `decide` on process 0 is raised there and, as a short error
    pointing to process 0, on every other process, so that none waits for the rest."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return [int(v) for v in decide()]

    error, values = None, []
    if jax.process_index() == 0:
        try:
            values = [int(v) for v in decide()]
        except ConfigError as e:
            error = e
    count = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if error else len(values))))
    if count < 0:
        raise (
            error
            if error is not None
            else ConfigError("multihost", "process 0 stopped with a config error (see its output)")
        )
    if count == 0:
        return []
    sent = np.asarray(values if values else [0] * count, np.int32)
    return [int(v) for v in np.asarray(multihost_utils.broadcast_one_to_all(sent))]
