"""TensorBoard logger: scalars per task and a few text samples, as event files."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cairn import storage
from cairn.evaluation.loggers.base import MetricLogger


class TensorBoardLogger(MetricLogger):
    """Writes event files under `<dir>/<task>/` (scalars `eval/<metric>`, text `samples`).

    TensorFlow's summary writer produces the files; it is imported on first use, so
    `import cairn.evaluation` stays light. `output_dir` may be a URL: the event files are then
    written to a local staging copy and uploaded whole after each flush
    (`cairn.storage.StagedDirectory`), never through TensorFlow's own GCS client.
    """

    def __init__(self, output_dir: str | os.PathLike, num_text_samples: int = 8):
        self.output_dir = os.fspath(output_dir)
        self.num_text_samples = num_text_samples
        self._writers: dict[str, Any] = {}
        self._staged = storage.StagedDirectory(self.output_dir)

    def _writer(self, task_name: str):
        if task_name not in self._writers:
            import tensorflow as tf

            self._writers[task_name] = tf.summary.create_file_writer(os.path.join(self._staged.local_dir, task_name))
        return self._writers[task_name]

    def log_metrics(self, task_name: str, step: int, metrics: Mapping[str, float]) -> None:
        import tensorflow as tf

        writer = self._writer(task_name)
        with writer.as_default():
            for name in sorted(metrics):
                tf.summary.scalar(f"eval/{name}", float(metrics[name]), step=int(step))
        writer.flush()
        self._staged.sync()

    def log_examples(self, task_name: str, step: int, examples: Sequence[Mapping[str, Any]]) -> None:
        import tensorflow as tf

        rows = []
        for row in list(examples)[: self.num_text_samples]:
            rows.append(" | ".join(f"**{k}**: {row[k]}" for k in ("inputs", "targets", "prediction") if k in row))
        if not rows:
            return
        writer = self._writer(task_name)
        with writer.as_default():
            tf.summary.text("samples", "\n\n".join(rows), step=int(step))
        writer.flush()
        self._staged.sync()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._staged.close()
