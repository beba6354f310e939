"""`ContinuationEvaluator`: a decoder-only model's evaluation with prediction metrics.

It answers as a `cairn.evaluation.Evaluator` does (`evaluate(predict_fn=, score_fn=, step=)`,
`task_names`, `examples`, `targets`), so the eval entry point and the trainer's
`evaluator_callback` take it unchanged. Per task, score metrics run on the task as it is
(the family's `LMFeatureConverter`, the whole sequence: perplexity is the same with or without
decoding) and prediction metrics on its decode view (`decode_views`: a prompt continued,
compared with what follows it). The loggers get each task's metrics of both, once, and one
example row per example: the score row updated by the decode view's (`inputs` = the prompt,
`targets` = what the prediction is compared with, `prediction`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cairn.evaluation import MetricLogger
from cairn.evaluation.metric_objects import metric_kind
from cairn.launchers import decode_views


class _Collect(MetricLogger):
    """Keeps what an inner Evaluator would log, for `ContinuationEvaluator` to merge."""

    def __init__(self) -> None:
        self.metrics: dict[str, dict[str, float]] = {}
        self.rows: dict[str, list[dict]] = {}

    def log_metrics(self, task_name: str, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics.setdefault(task_name, {}).update(metrics)

    def log_examples(self, task_name: str, step: int, examples: Sequence[Mapping[str, Any]]) -> None:
        self.rows[task_name] = [dict(r) for r in examples]


class ContinuationEvaluator:
    """Score metrics on the tasks, prediction metrics on their decode views (module docstring).

    Args:
      tasks: `{name: Task}` (a task, or a mixture's tasks); those without `split` are skipped.
      feature_converter: the family's converter (`pack=False`) for the score metrics.
      sequence_length: `data.sequence_length` (`targets`; a prefix-LM task's `inputs`).
      split, num_examples, seed, loggers: as `Evaluator`'s.
    """

    def __init__(
        self,
        tasks: Mapping[str, Any],
        feature_converter: Any,
        sequence_length: Mapping[str, int],
        split: str = "validation",
        num_examples: int | None = None,
        seed: int = 0,
        loggers: Sequence[MetricLogger] = (),
    ):
        from cairn.evaluation import EvaluationError, Evaluator

        self.split = split
        self.loggers = tuple(loggers)
        self._collect = _Collect()
        self._scores: dict[str, Any] = {}
        self._decodes: dict[str, Any] = {}
        kept = sorted(n for n, t in tasks.items() if split in t.splits)
        if not kept:
            raise EvaluationError(f"no task of {sorted(tasks)} has the split {split!r}")
        lengths = {"targets": int(sequence_length["targets"])}
        for name in kept:
            task = tasks[name]
            kinds = {metric_kind(fn) for fn in (*task.metric_fns, *getattr(task, "metric_objs", ()))}
            if "prediction" in kinds:
                self._decodes[name] = decode_views.view_evaluator(
                    task, sequence_length, split, num_examples, seed, ("prediction",), (self._collect,)
                )
            if kinds - {"prediction"} or not kinds:  # score (or unusable) metrics: the task as it is
                view = decode_views.with_metrics(task, ("score", "unknown")) if "prediction" in kinds else task
                self._scores[name] = Evaluator(
                    view,
                    feature_converter,
                    split=split,
                    num_examples=num_examples,
                    seed=seed,
                    sequence_length=lengths,
                    loggers=(self._collect,),
                )

    @property
    def task_names(self) -> list[str]:
        return sorted({*self._scores, *self._decodes})

    def _first(self, task_name: str) -> Any:
        return self._scores.get(task_name) or self._decodes[task_name]

    def examples(self, task_name: str) -> list:
        """The task's evaluation examples (as the score metrics read them, else the decode view's)."""
        return self._first(task_name).examples(task_name)

    def targets(self, task_name: str) -> list:
        return self._first(task_name).targets(task_name)

    def decode_examples(self, task_name: str) -> list | None:
        """The decode view's examples (`inputs` = prompt, `targets`), None without prediction metrics."""
        return self._decodes[task_name].examples(task_name) if task_name in self._decodes else None

    def evaluate(self, *, predict_fn: Any = None, score_fn: Any = None, step: int | None = None) -> Any:
        """Both parts of every task; one `EvaluationResult` (metrics, errors, predictions, scores)."""
        from cairn.evaluation import EvaluationResult

        result = EvaluationResult()
        self._collect.metrics.clear()
        self._collect.rows.clear()
        parts = [(self._scores, {"score_fn": score_fn}), (self._decodes, {"predict_fn": predict_fn})]
        for name in self.task_names:
            rows: dict[int, dict] = {}
            for evaluators, fn in parts:
                if name not in evaluators:
                    continue
                r = evaluators[name].evaluate(step=step, **fn)
                for k, v in r.metrics.get(name, {}).items():
                    result.metrics.setdefault(name, {}).setdefault(k, v)
                for message in r.errors.get(name, []):
                    result.errors.setdefault(name, []).append(message)
                for store in ("predictions", "scores"):
                    if name in getattr(r, store):
                        getattr(result, store)[name] = getattr(r, store)[name]
                for row in self._collect.rows.pop(name, []):
                    rows.setdefault(row["index"], {}).update(row)
            for logger in self.loggers:
                if name in result.metrics:
                    logger.log_metrics(name, step or 0, result.metrics[name])
                logger.log_examples(name, step or 0, [rows[i] for i in sorted(rows)])
        return result
