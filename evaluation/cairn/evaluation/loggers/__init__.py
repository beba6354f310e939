"""Metric loggers: where evaluation results go."""

from cairn.evaluation.loggers.base import MetricLogger
from cairn.evaluation.loggers.json_lines import JsonLinesLogger, read_metrics
from cairn.evaluation.loggers.tensorboard import TensorBoardLogger

__all__ = ["JsonLinesLogger", "MetricLogger", "TensorBoardLogger", "read_metrics"]
