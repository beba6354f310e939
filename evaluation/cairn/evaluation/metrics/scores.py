"""Metrics on model scores (per-example log-likelihoods of the targets)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cairn.evaluation.metrics._checks import MetricInputError, same_length


def mean_log_likelihood(targets: Sequence[Any], scores: Sequence[float]) -> dict[str, float]:
    """Mean per-example log-likelihood (natural log)."""
    same_length("mean_log_likelihood", targets, scores, "scores")
    return {"mean_log_likelihood": float(np.mean(np.asarray(scores, dtype=np.float64)))}


def perplexity(targets: Sequence[Any], scores: Sequence[float], num_tokens: Sequence[int]) -> dict[str, float]:
    """Corpus perplexity: exp(-sum of log-likelihoods / number of target tokens).

    `scores` are per-example total log-likelihoods (natural log) and `num_tokens` the
    number of target tokens each was summed over (EOS included); the Evaluator passes
    `num_tokens` to any score metric that names it.
    """
    same_length("perplexity", targets, scores, "scores")
    same_length("perplexity", targets, num_tokens, "token counts")
    total_tokens = int(np.sum(num_tokens))
    if total_tokens <= 0:
        raise MetricInputError("perplexity: the targets hold no tokens")
    nll = -float(np.sum(np.asarray(scores, dtype=np.float64)))
    return {"perplexity": math.exp(nll / total_tokens), "nll_per_token": nll / total_tokens}
