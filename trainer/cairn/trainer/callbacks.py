"""The trainer's callbacks: `evaluator_callback` (an `eval_fn` from a `cairn.evaluation.Evaluator`)
and `takes_metrics` (whether a step hook takes the step's metrics)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("cairn.trainer")
EvalFn = Callable[[Any, int], Mapping[str, Any]]


def takes_metrics(hook: Callable) -> bool:
    """Whether `hook` accepts a third positional argument (the step's metrics)."""
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin): the two-argument form
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3


def evaluator_callback(
    evaluator: Any, make_predict_fn: Callable | None = None, make_score_fn: Callable | None = None
) -> EvalFn:
    """An `eval_fn` from a `cairn.evaluation.Evaluator`: `make_predict_fn(params)` /
    `make_score_fn(params)` build the functions `Evaluator.evaluate` takes; returns
    `{task: {metric: value}}`."""

    def eval_fn(params, step):
        result = evaluator.evaluate(
            predict_fn=make_predict_fn(params) if make_predict_fn else None,
            score_fn=make_score_fn(params) if make_score_fn else None,
            step=step,
        )
        for task, errors in result.errors.items():
            log.warning("evaluation of %s at step %d: %s", task, step, "; ".join(errors))
        return result.metrics

    return eval_fn
