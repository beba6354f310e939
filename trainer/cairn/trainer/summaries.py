"""Train summaries: the log, JSON lines, TensorBoard event files (TensorFlow imported lazily),
and a progress line on interactive terminals."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from cairn import storage
from cairn.evaluation import JsonLinesLogger

log = logging.getLogger("cairn.trainer")


class SummaryWriter:
    """Writes scalars to `<model_dir>/summaries/metrics.jsonl` (rows `{task, step, metric, value}`)
    and, when `tensorboard`, event files under `<model_dir>/tensorboard/<task>/` as `<task>/<name>`.

    Only the `primary` writer (process 0 of a multi-process run) writes files; every writer logs
    its values, each line starting with `log_prefix` (e.g. `process 1/4: `).

    `model_dir` may be a URL: the JSON lines are then flushed as whole part objects at each
    logged (not quiet) step and at `close()`, and the event files are staged locally and
    uploaded whole after each flush (never a torn object)."""

    def __init__(
        self, model_dir: str | os.PathLike, tensorboard: bool = True, *, primary: bool = True, log_prefix: str = ""
    ):
        self.dir = os.fspath(model_dir)
        self.primary = primary
        self.log_prefix = log_prefix
        self.jsonl = JsonLinesLogger(storage.join(self.dir, "summaries")) if primary else None
        self.tensorboard = tensorboard and primary
        self._writers: dict = {}
        self._staged: storage.StagedDirectory | None = None

    def _tb(self, task: str):
        if task not in self._writers:
            import tensorflow as tf  # lazy: only when TensorBoard files are wanted

            if self._staged is None:
                self._staged = storage.StagedDirectory(storage.join(self.dir, "tensorboard"))
            self._writers[task] = tf.summary.create_file_writer(os.path.join(self._staged.local_dir, task))
        return self._writers[task]

    def scalars(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None:
        """Writes `values`; `quiet` writes the JSON lines only (per-step rows between log steps)."""
        if self.jsonl is not None:
            self.jsonl.log_metrics(task, step, values, flush=not quiet)
        if quiet:
            return
        if self.tensorboard:
            import tensorflow as tf

            writer = self._tb(task)
            with writer.as_default():
                for name in sorted(values):
                    tf.summary.scalar(f"{task}/{name}", float(values[name]), step=int(step))
            writer.flush()
            if self._staged is not None:
                self._staged.sync()
        text = "  ".join(f"{k}={_fmt(v)}" for k, v in sorted(values.items()))
        log.info("%s%s step %d: %s", self.log_prefix, task, step, text)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self._staged is not None:
            self._staged.close()
            self._staged = None
        if self.jsonl is not None:
            self.jsonl.close()


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class ProgressLine:
    """`step 120/1000  3.2 steps/s  ETA 4m35s` rewritten in place, only on a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, step: int, steps_per_second: float, extra: str = "") -> None:
        if not self.enabled:
            return
        eta = (self.total - step) / steps_per_second if steps_per_second > 0 else float("inf")
        self.stream.write(f"\rstep {step}/{self.total}  {steps_per_second:.2f} steps/s  ETA {_duration(eta)}  {extra}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
