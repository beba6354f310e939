"""Train summaries: the metric writers of a run (JSON lines, TensorBoard, optionally Weights &
Biases; `cairn.trainer.writers`) behind one `SummaryWriter`, and the values in the log."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from cairn import storage
from cairn.trainer.writers import JsonlWriter, MetricWriter, TensorBoardWriter, WandbWriter, wandb_run_id

log = logging.getLogger("cairn.trainer")


class SummaryWriter:
    """Writes scalars to every writer: `<model_dir>/summaries/metrics.jsonl` (rows `{task, step,
    metric, value}`), with `tensorboard` event files under `<model_dir>/tensorboard/<task>/` as
    `<task>/<name>`, with `wandb` (a W&B project name) an offline W&B run under
    `<model_dir>/wandb/`, and any `extra` writers.

    Only the `primary` writer (process 0 of a multi-process run) writes; every writer logs its
    values at `log_level` (DEBUG by default: the console's progress line shows a run's figures),
    each line starting with `log_prefix` (a multi-process run's `process 1/4: `).

    `model_dir` may be a URL: the JSON lines are then flushed as whole part objects at each
    logged (not quiet) step, at `flush()` and at `close()`, and the event files are staged
    locally and uploaded whole after each flush (never a torn object)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        tensorboard: bool = True,
        *,
        primary: bool = True,
        log_prefix: str = "",
        wandb: str = "",
        extra: Sequence[MetricWriter] = (),
        log_level: int = logging.DEBUG,
    ):
        self.dir = os.fspath(model_dir)
        self.primary = primary
        self.log_prefix = log_prefix
        self.log_level = log_level
        self.writers: list[MetricWriter] = []
        if primary:
            self.writers.append(JsonlWriter(self.dir))
            if tensorboard:
                self.writers.append(TensorBoardWriter(self.dir))
            if wandb:
                self.writers.append(WandbWriter(_local_dir(self.dir), wandb, name=os.path.basename(self.dir)))
            self.writers.extend(extra)

    def scalars(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None:
        """Writes `values`; `quiet` rows (per-step rows between log steps) reach the JSON lines
        only and are not logged."""
        for writer in self.writers:
            writer.write(task, step, values, quiet=quiet)
        if not quiet:
            text = "  ".join(f"{k}={_fmt(v)}" for k, v in sorted(values.items()))
            log.log(self.log_level, "%s%s step %d: %s", self.log_prefix, task, step, text)

    def flush(self) -> None:
        """Makes every row written so far durable (at a URL: uploaded)."""
        for writer in self.writers:
            writer.flush()

    def close(self) -> None:
        """Flushes and closes every writer (each one even if another fails)."""
        errors = []
        for writer in self.writers:
            try:
                writer.close()
            except Exception as e:  # close the others, then report the first
                errors.append(e)
        self.writers.clear()
        if errors:
            raise errors[0]


def _local_dir(model_dir: str) -> str:
    """Where W&B's files go: the model_dir, or for a bucket a local folder named by its run id."""
    if storage.is_url(model_dir):
        return os.path.join(os.path.expanduser("~/.cache/cairn/wandb"), wandb_run_id(model_dir))
    return model_dir


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
