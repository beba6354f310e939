"""JSON-lines logger: one row per metric and step, one row per example."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.evaluation.loggers.base import MetricLogger


def _plain(value: Any) -> Any:
    """Makes numpy values, bytes and tuples JSON-serializable."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class JsonLinesLogger(MetricLogger):
    """Writes `<dir>/metrics.jsonl` and `<dir>/examples/<task>-<step>.jsonl`.

    Metric rows: `{"task", "step", "metric", "value"}`. Example rows: whatever the
    Evaluator gives, normally `{"index", "inputs", "targets", "prediction", "score"}`.
    The examples file of a step is replaced whole (written to a temporary then renamed).
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = pathlib.Path(output_dir)
        (self.output_dir / "examples").mkdir(parents=True, exist_ok=True)

    def log_metrics(self, task_name: str, step: int, metrics: Mapping[str, float]) -> None:
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            for name in sorted(metrics):
                row = {"task": task_name, "step": int(step), "metric": name,
                       "value": _plain(metrics[name])}
                f.write(json.dumps(row, sort_keys=True) + "\n")

    def log_examples(self, task_name: str, step: int, examples: Sequence[Mapping[str, Any]]) -> None:
        path = self.output_dir / "examples" / f"{task_name}-{int(step):08d}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in examples:
                f.write(json.dumps(_plain(row), sort_keys=True, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
