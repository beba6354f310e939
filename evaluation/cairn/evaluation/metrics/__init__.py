"""Metric functions, seqio-style: each takes `(targets, predictions)` or `(targets, scores)`
and returns a dict of named floats. Percentages are 0-100, as in T5's metrics."""

from cairn.evaluation.metrics.classification import accuracy, exact_match, sequence_accuracy
from cairn.evaluation.metrics.qa import normalize_squad, squad
from cairn.evaluation.metrics.regression import pearson_corrcoef, spearman_corrcoef
from cairn.evaluation.metrics.scores import mean_log_likelihood, perplexity
from cairn.evaluation.metrics.text import bleu, rouge

__all__ = [
    "accuracy",
    "bleu",
    "exact_match",
    "mean_log_likelihood",
    "normalize_squad",
    "pearson_corrcoef",
    "perplexity",
    "rouge",
    "sequence_accuracy",
    "spearman_corrcoef",
    "squad",
]
