"""Argument checks shared by the metric functions."""

from __future__ import annotations

from collections.abc import Sequence


class MetricInputError(ValueError):
    """A metric was given inputs it cannot score (e.g. lists of different lengths)."""


def same_length(metric: str, targets: Sequence, others: Sequence, what: str = "predictions") -> None:
    if len(targets) != len(others):
        raise MetricInputError(f"{metric}: {len(targets)} targets but {len(others)} {what}; they must pair up")
    if not targets:
        raise MetricInputError(f"{metric}: no examples to score")
