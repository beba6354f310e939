"""The logger interface the Evaluator writes to."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any


class MetricLogger(abc.ABC):
    """Receives each task's metrics and per-example outputs at a step."""

    @abc.abstractmethod
    def log_metrics(self, task_name: str, step: int, metrics: Mapping[str, float]) -> None:
        """Records scalar metrics of one task at one step."""

    def log_examples(self, task_name: str, step: int, examples: Sequence[Mapping[str, Any]]) -> None:  # noqa: B027
        """Records per-example rows (inputs, targets, prediction, score). Optional."""

    def close(self) -> None:  # noqa: B027 - optional hooks: a no-op unless overridden
        """Flushes and releases files."""
