"""Correlation metrics for regression tasks (e.g. STS-B), in percent like T5's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cairn.evaluation.metrics._checks import MetricInputError, same_length


def _as_floats(metric: str, values: Sequence, what: str) -> np.ndarray:
    try:
        return np.asarray([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise MetricInputError(f"{metric}: {what} must be numbers ({e})") from None


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else float("nan")


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), as Spearman's rho needs."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Pearson's r times 100."""
    same_length("pearson_corrcoef", targets, predictions)
    t = _as_floats("pearson_corrcoef", targets, "targets")
    p = _as_floats("pearson_corrcoef", predictions, "predictions")
    return {"pearson_corrcoef": 100.0 * _pearson(t, p)}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Spearman's rho (Pearson's r of average ranks) times 100."""
    same_length("spearman_corrcoef", targets, predictions)
    t = _as_floats("spearman_corrcoef", targets, "targets")
    p = _as_floats("spearman_corrcoef", predictions, "predictions")
    return {"spearman_corrcoef": 100.0 * _pearson(_ranks(t), _ranks(p))}
