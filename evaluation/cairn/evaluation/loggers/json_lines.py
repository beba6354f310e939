"""JSON-lines logger: one row per metric and step, one row per example."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn import storage
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


METRICS_FILE = "metrics.jsonl"


class JsonLinesLogger(MetricLogger):
    """Writes `<dir>/metrics.jsonl` and `<dir>/examples/<task>-<step>.jsonl`; `<dir>` may be a
    URL (`gs://...`).

    Metric rows: `{"task", "step", "metric", "value"}`, appended to a local file; at a URL,
    buffered and written as whole part objects (`metrics.jsonl.parts/<n>.jsonl`) on `flush()`,
    on `log_metrics(..., flush=True)` and on `close()` (`read_metrics` reads both forms).
    Example rows: whatever the Evaluator gives, normally `{"index", "inputs", "targets",
    "prediction", "score"}`; the examples file of a step is replaced whole (atomically).
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = os.fspath(output_dir)
        self._metrics = storage.JsonLinesWriter(storage.join(self.output_dir, METRICS_FILE))

    def log_metrics(self, task_name: str, step: int, metrics: Mapping[str, float], flush: bool = True) -> None:
        rows = [
            {"task": task_name, "step": int(step), "metric": name, "value": _plain(metrics[name])}
            for name in sorted(metrics)
        ]
        self._metrics.append(rows, flush=flush)

    def flush(self) -> None:
        self._metrics.flush()

    def log_examples(self, task_name: str, step: int, examples: Sequence[Mapping[str, Any]]) -> None:
        path = storage.join(self.output_dir, "examples", f"{task_name}-{int(step):08d}.jsonl")
        storage.write_text(
            path, "".join(json.dumps(_plain(row), sort_keys=True, ensure_ascii=False) + "\n" for row in examples)
        )

    def close(self) -> None:
        self._metrics.close()


def read_metrics(output_dir: str | os.PathLike) -> tuple[list[dict], int]:
    """`(rows, bad)`: the metric rows a `JsonLinesLogger` wrote under `output_dir` (local or
    URL), in order; `bad` counts unreadable lines (a truncated last line is not counted)."""
    return storage.read_json_lines(storage.join(os.fspath(output_dir), METRICS_FILE))
