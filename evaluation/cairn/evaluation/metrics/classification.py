"""Accuracy-style metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cairn.evaluation.metrics._checks import same_length


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """Percentage of predictions equal to their target (labels, class ids, strings)."""
    same_length("accuracy", targets, predictions)
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def sequence_accuracy(targets: Sequence[Sequence[Any]], predictions: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Percentage of predicted sequences (strings or token lists) equal to the target exactly."""
    same_length("sequence_accuracy", targets, predictions)
    hits = [list(t) == list(p) if not isinstance(t, str) else t == p for t, p in zip(targets, predictions)]
    return {"sequence_accuracy": 100.0 * float(np.mean(hits))}


def exact_match(targets: Sequence[str | Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of predictions equal to a reference after stripping surrounding whitespace.

    A target may be one string or a list of acceptable strings (any one matches).
    """
    same_length("exact_match", targets, predictions)
    hits = []
    for t, p in zip(targets, predictions):
        refs = [t] if isinstance(t, str) else list(t)
        hits.append(p.strip() in {r.strip() for r in refs})
    return {"exact_match": 100.0 * float(np.mean(hits))}
