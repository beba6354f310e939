"""Start-up shared by the train, eval and infer entry points, on one process or many: join
the job, check `model_dir`, look up and check the tasks, and bind the run's `RunSpec` to the
devices (`prepare`, returning a typed `RunSetup`); and let process 0 take the decisions that
depend on files (which checkpoint, which chunks are missing) so that every process runs the
same collectives. No entry point imports another: each imports this module. JAX is imported
inside the functions (`cli.loaded_config` refuses a config whose schema fails before any JAX
import: tests/launchers/entry_test.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cairn import storage
from cairn.launchers import data as data_lib
from cairn.launchers import multihost, run_spec, validation
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What `prepare` found and built: the training and evaluation tasks (by name), the mesh
    (axis name -> size) and the partitioner (`run_spec.bind`'s)."""

    tasks: Mapping[str, Any]
    eval_tasks: Mapping[str, Any]
    mesh: Mapping[str, int]
    partitioner: Any


def prepare(
    spec: RunSpec,
    *,
    train: bool = True,
    padded: Sequence[tuple[str, int]] = (),
    eval_task: bool = False,
    devices: Sequence[Any] | None = None,
) -> RunSetup:
    """Joins the job and checks what the spec could not check alone, before anything is compiled
    or written: the processes' configs, `model_dir`, the tasks against the sequence lengths, and
    the spec bound to the devices (`run_spec.bind`: the training batch with `train`, eval's and
    infer's `padded` batches, `(name, rows)`). The evaluation task is looked up and checked when
    the training config evaluates, or with `eval_task`. `devices`: another set than
    `jax.devices()` (a TPU slice described for an ahead-of-time compile), over as many hosts as
    their process indices."""
    import jax

    from cairn.partitioning import topology

    keys = spec.keys
    multihost.initialize(keys)
    multihost.check_same_config(spec.plain)
    check_model_dir(keys.model_dir)
    data_lib.register_tasks(keys, spec.vocabulary)
    tasks = data_lib.get_tasks(keys, "data.task")
    evaluates = eval_task or keys.post_training.final_eval or keys.trainer.eval_every
    eval_tasks = data_lib.get_tasks(keys, "eval.task") if evaluates else {}
    validation.check_data(keys, {**tasks, **eval_tasks})
    if devices is None:
        devices, hosts = jax.devices(), jax.process_count()
    else:
        hosts = topology.process_count(devices)
    bound = run_spec.bind(spec, devices, hosts, train=train, padded=padded)
    return RunSetup(tasks, eval_tasks, bound.mesh, bound.partitioner)


def check_model_dir(model_dir: str) -> None:
    """Every process can write `model_dir` (local, or a bucket: it exists, the endpoint answers,
    the credentials allow writing), else a `ConfigError` naming the URL and the cause; and no
    live run holds its lock (`ModelDirLockedError`), checked before anything is written."""
    import jax

    from cairn.trainer import ModelDirLock

    error: Exception | None = None
    try:
        storage.check_writable(model_dir)
        if jax.process_index() == 0:
            ModelDirLock(model_dir).check_free()  # before config.json is rewritten
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
