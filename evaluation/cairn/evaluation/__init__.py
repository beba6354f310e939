"""cairn.evaluation: evaluators, metric functions and metric loggers.

Importing it loads no JAX (it evaluates any model function, ours or not) and no
TensorFlow until a dataset or the TensorBoard logger is used.
"""

from cairn.evaluation import metric_objects, metrics
from cairn.evaluation.loggers import JsonLinesLogger, MetricLogger, TensorBoardLogger, read_metrics
from cairn.evaluation.metric_objects import LegacyMetric, Metric, ModelOutputType
from cairn.evaluation.metrics._checks import MetricInputError

__version__ = "0.1.0"

__all__ = [
    "EvaluationError",
    "EvaluationResult",
    "Evaluator",
    "JsonLinesLogger",
    "LegacyMetric",
    "Metric",
    "MetricInputError",
    "MetricLogger",
    "ModelOutputType",
    "TensorBoardLogger",
    "metric_objects",
    "metrics",
    "read_metrics",
]

_LAZY = ("Evaluator", "EvaluationError", "EvaluationResult")


def __getattr__(name: str):
    # The Evaluator reads datasets with TensorFlow; import it (and TF) only when used.
    if name in _LAZY:
        from cairn.evaluation import evaluator

        return getattr(evaluator, name)
    raise AttributeError(f"module 'cairn.evaluation' has no attribute {name!r}")
