"""Start-up of the eval and infer entry points on one process or many: join the job, validate
what they use (not the training batch), and let process 0 take the decisions that depend on
files (which checkpoint, which chunks are missing) so that every process runs the same
collectives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from cairn.launchers import data as data_lib
from cairn.launchers import train_main, validation
from cairn.launchers.validation import ConfigError


def prepare(config: ml_collections.ConfigDict, eval_task: bool = True) -> dict[str, Any]:
    """Joins the job and validates the config as the train entry point does (the same start-up
    bound, config agreement, mesh and data checks) but checks no batch size: the caller checks
    its own (`sharded_batches.check_batch_size`), never `data.batch_size`. With `eval_task`,
    the evaluation task is looked up and checked too. Returns `train_main.prepare`'s dict
    (`"vocabulary"`, `"eval_tasks"`, `"partitioner"`, ...)."""
    ready = train_main.prepare(config, batch_keys=())
    if eval_task and not ready["eval_tasks"]:
        ready["eval_tasks"] = data_lib.get_tasks(config, "eval.task")
        validation.check_data(config, ready["eval_tasks"])
    return ready


def is_process_0() -> bool:
    """Whether this is the process that writes files and prints."""

    return jax.process_index() == 0


def print_on_process_0(text: str) -> None:
    """Prints (flushed) on process 0 only."""
    if is_process_0():
        print(text, flush=True)


def from_process_0(decide: Callable[[], Sequence[int]]) -> list[int]:
    """`decide()` (a list of ints) run on process 0 only, its result given to every process.

    A `ConfigError` raised by `decide` on process 0 is raised there and, as a short error
    pointing to process 0, on every other process, so that none waits for the rest."""

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
