"""Metric writers: where a run's scalars go (design §7). JSON lines and TensorBoard by default;
Weights & Biases when asked (`wandb`, imported only then).

A writer has `write(task, step, values, quiet=False)`, `flush()` and `close()`. `quiet` rows
are the per-step rows between log steps: JSON lines keep every one (so no step is missing),
TensorBoard and W&B take only the logged steps. `flush()` makes what was written durable (it
is called at each log step, on SIGTERM, on a NaN stop and on every exit path)."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Protocol

from cairn import storage
from cairn.evaluation import JsonLinesLogger


class MetricWriter(Protocol):
    """What `SummaryWriter` hands every scalar to."""

    def write(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class JsonlWriter:
    """`<model_dir>/summaries/metrics.jsonl`: rows `{task, step, metric, value}` (every step)."""

    def __init__(self, model_dir: str):
        self.logger = JsonLinesLogger(storage.join(model_dir, "summaries"))

    def write(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None:
        self.logger.log_metrics(task, step, values, flush=not quiet)

    def flush(self) -> None:
        self.logger.flush()

    def close(self) -> None:
        self.logger.close()


class _EventFile:
    """One TensorBoard event file (TFRecord framing of `Event` protos, as TensorFlow's summary
    writer lays it out: a `brain.Event:2` version record first), written with the `tensorboard`
    package's record framing and protos. TensorFlow is never imported: `tensorboard`'s own
    `EventFileWriter` opens files through `tf.io.gfile`, which imports it when installed."""

    def __init__(self, folder: str):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        os.makedirs(folder, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.{id(self)}.v2"
        self._event = event_pb2.Event
        self._records = RecordWriter(open(os.path.join(folder, name), "wb"))
        self._records.write(self._event(wall_time=now, file_version="brain.Event:2").SerializeToString())

    def scalars(self, step: int, values: Mapping[str, float], prefix: str) -> None:
        """One event per value: `<prefix>/<name>` as the scalars plugin's float tensor."""
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        for name in sorted(values):
            summary = scalar_pb(f"{prefix}/{name}", float(values[name]))
            event = self._event(step=int(step), wall_time=time.time(), summary=summary)
            self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class TensorBoardWriter:
    """Event files under `<model_dir>/tensorboard/<task>/`, scalars named `<task>/<name>`, as
    `tf.summary.scalar` writes them (a float tensor with the scalars plugin's metadata), written
    without TensorFlow (`_EventFile`; `tensorboard` imported on the first write): a training
    run does not import TensorFlow (~7 s, ~700 MB) for its summaries. At a URL the files are
    staged locally and uploaded whole at each flush (never a torn object)."""

    def __init__(self, model_dir: str):
        self.dir = storage.join(model_dir, "tensorboard")
        self._writers: dict[str, _EventFile] = {}
        self._staged: storage.StagedDirectory | None = None

    def _writer(self, task: str) -> _EventFile:
        if task not in self._writers:
            if self._staged is None:
                self._staged = storage.StagedDirectory(self.dir)
            self._writers[task] = _EventFile(os.path.join(self._staged.local_dir, task))
        return self._writers[task]

    def write(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None:
        if quiet:
            return
        self._writer(task).scalars(step, values, task)
        self.flush()

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()
        if self._staged is not None:
            self._staged.sync()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self._staged is not None:
            self._staged.close()
            self._staged = None


def wandb_run_id(model_dir: str) -> str:
    """The W&B run id of a model_dir: stable, so a resumed run continues the same W&B run."""
    return "cairn-" + hashlib.sha256(os.fspath(model_dir).encode()).hexdigest()[:16]


class WandbWriter:
    """A Weights & Biases run in offline mode, its files under `<dir>/wandb/` (upload them with
    `wandb sync <dir>/wandb/offline-run-*`). `project`: the W&B project; `name` the run's name;
    `config` its config. Each logged step is one `log({"<task>/<name>": value}, step=step)`.
    `wandb` is imported here: a missing package is an `ImportError` naming the pip line."""

    def __init__(
        self,
        dir: str,
        project: str,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ):
        try:  # an optional extra (`cairn-trainer[wandb]`), imported only when asked for
            import wandb
        except ImportError as e:
            raise ImportError(f"logging.wandb needs the wandb package (pip install wandb): {e}") from e
        os.makedirs(dir, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            dir=dir,
            mode="offline",
            id=run_id or wandb_run_id(dir),
            resume="allow",
            config=dict(config or {}),
            settings=wandb.Settings(silent=True, console="off"),  # the console is cairn's
        )
        self.dir = self.run.dir

    def write(self, task: str, step: int, values: Mapping[str, float], quiet: bool = False) -> None:
        if quiet:
            return
        self.run.log({f"{task}/{name}": float(values[name]) for name in sorted(values)}, step=int(step))

    def flush(self) -> None:
        """W&B's own process writes the run file as rows arrive; nothing is buffered here."""

    def close(self) -> None:
        self.run.finish()
