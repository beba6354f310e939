"""cairn.evaluation: Evaluators, metric functions and metric loggers."""

__version__ = "0.1.0"
