"""`Evaluator`: runs a model function over a task's or mixture's evaluation examples and
computes each task's metrics, seqio-style.

The evaluation examples are read once (unshuffled, in order), kept in memory with their
index, and converted once for the model. `evaluate` hands the model functions a
`tf.data.Dataset` of `(index, features)` pairs per task; they return `(index, output)`
pairs in any order (e.g. gathered from several hosts), and the Evaluator restores the
order from the indices before computing metrics.

Metric functions are chosen by their signature, as in seqio: `(targets, predictions)` or
`(targets, predictions, aux_values)` are prediction metrics; `(targets, scores)` are score
metrics, which may also name `num_tokens` (target tokens per example, EOS included).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from cairn.datatasks import FeatureConverter, Mixture, Registry, Task, get_mixture_or_task
from cairn.evaluation.loggers.base import MetricLogger
from cairn.evaluation.metric_objects import metric_kind

log = logging.getLogger(__name__)

PredictFn = Callable[[tf.data.Dataset], Sequence[tuple[int, Any]]]
ScoreFn = Callable[[tf.data.Dataset], Sequence[tuple[int, float]]]


class EvaluationError(ValueError):
    """The Evaluator cannot be built (e.g. no task has the split)."""


@dataclasses.dataclass
class EvaluationResult:
    """What `evaluate` returns.

    Attributes:
      metrics: `{task: {metric: value}}` for every metric that ran.
      errors: `{task: [message, ...]}` for what could not be computed; each message names
        the task and, where there is one, the metric.
      predictions: `{task: [postprocessed prediction, ...]}` in example order.
      scores: `{task: [score, ...]}` in example order.
    """

    metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    errors: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    predictions: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    scores: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def _error(self, task: str, message: str) -> None:
        log.error(message)
        self.errors.setdefault(task, []).append(message)


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _text(vocabulary, ids) -> str:
    out = vocabulary.decode(np.asarray(ids).tolist())
    return out if isinstance(out, str) else str(out)


@dataclasses.dataclass
class _TaskData:
    task: Task
    examples: list[dict[str, np.ndarray]]
    targets: list[Any]
    model_dataset: tf.data.Dataset


class Evaluator:
    """Builds the evaluation data of a task or mixture once; `evaluate` scores a model.

    Args:
      mixture_or_task_name: a registered task or mixture name (or the object).
      feature_converter: converts task features to model features; must not pack.
      split: the split to evaluate; tasks of a mixture that lack it are skipped.
      num_examples: evaluate on the first `num_examples` examples of each task.
      seed: the seed of any random preprocessing (the order itself is not shuffled).
      sequence_length: task feature lengths; default the longest example of each feature.
      registry: where names are looked up (default: the global registry).
      loggers: where metrics and per-example outputs are written.
      metric_chunk_size: metric objects (`Task.metric_objs`) are built from this many
        examples at a time and merged (None: all at once); metric functions see every example.
    """

    def __init__(
        self,
        mixture_or_task_name: str | Task | Mixture,
        feature_converter: FeatureConverter,
        split: str = "validation",
        num_examples: int | None = None,
        seed: int | None = 0,
        sequence_length: Mapping[str, int] | None = None,
        registry: Registry | None = None,
        loggers: Sequence[MetricLogger] = (),
        metric_chunk_size: int | None = None,
    ):
        if metric_chunk_size is not None and metric_chunk_size < 1:
            raise EvaluationError(f"metric_chunk_size must be None or >= 1, got {metric_chunk_size}")
        self._chunk = metric_chunk_size
        if feature_converter.pack:
            raise EvaluationError(
                f"{feature_converter!r}: evaluation needs pack=False, so each model row is one example"
            )
        obj = mixture_or_task_name
        if isinstance(obj, str):
            obj = get_mixture_or_task(obj, registry)
        tasks = list(obj.tasks.values()) if isinstance(obj, Mixture) else [obj]
        tasks = sorted((t for t in tasks if split in t.splits), key=lambda t: t.name)
        if not tasks:
            raise EvaluationError(f"no task of {getattr(obj, 'name', obj)!r} has the split {split!r}")
        self.split = split
        self.loggers = tuple(loggers)
        self._converter = feature_converter
        self._data: dict[str, _TaskData] = {}
        for task in tasks:
            self._data[task.name] = self._build(task, num_examples, seed, sequence_length)

    @property
    def task_names(self) -> list[str]:
        return list(self._data)

    def examples(self, task_name: str) -> list[dict[str, np.ndarray]]:
        """The task's evaluation examples (preprocessed task features), in order."""
        return self._data[task_name].examples

    def targets(self, task_name: str) -> list[Any]:
        """The postprocessed targets the metrics compare against."""
        return self._data[task_name].targets

    def model_dataset(self, task_name: str) -> tf.data.Dataset:
        """`(index, model features)` pairs of the task, unbatched, in order."""
        return self._data[task_name].model_dataset

    def _build(
        self, task: Task, num_examples: int | None, seed: int | None, sequence_length: Mapping[str, int] | None
    ) -> _TaskData:
        ds = task.get_dataset(
            sequence_length,
            split=self.split,
            shuffle=False,
            seed=seed,
            num_epochs=1,
            trim_output_features=sequence_length is not None,
        )
        if num_examples is not None:
            ds = ds.take(num_examples)
        examples = list(ds.as_numpy_iterator())
        if not examples:
            raise EvaluationError(f"task {task.name!r} has no examples in split {self.split!r}")
        lengths = dict(sequence_length or {})
        for k in task.output_features:
            if k not in lengths and examples[0].get(k) is not None and np.ndim(examples[0][k]) == 1:
                lengths[k] = max(1, max(len(ex[k]) for ex in examples))
        targets = [self._postprocess(task, self._target_text(task, ex), ex, True) for ex in examples]
        spec = {
            k: tf.TensorSpec.from_tensor(tf.constant(v)) for k, v in examples[0].items() if k in task.output_features
        }
        spec = {k: tf.TensorSpec([None] * s.shape.rank, s.dtype) for k, s in spec.items()}
        features = tf.data.Dataset.from_generator(
            lambda: ({k: ex[k] for k in spec} for ex in examples), output_signature=spec
        )
        model_ds = self._converter(features, {k: n for k, n in lengths.items() if k in spec})
        model_ds = tf.data.Dataset.zip((tf.data.Dataset.range(len(examples)), model_ds))
        return _TaskData(task, examples, targets, model_ds.cache())

    @staticmethod
    def _target_text(task: Task, ex: Mapping[str, Any]) -> Any:
        if "targets_pretokenized" in ex:
            raw = ex["targets_pretokenized"]
            return raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return _text(task.output_features["targets"].vocabulary, ex["targets"])

    @staticmethod
    def _postprocess(task: Task, value: Any, example: Mapping[str, Any], is_target: bool) -> Any:
        if task.postprocess_fn is None:
            return value
        return task.postprocess_fn(value, example=example, is_target=is_target)

    # ---------------------------------------------------------------------------------
    def evaluate(
        self, *, predict_fn: PredictFn | None = None, score_fn: ScoreFn | None = None, step: int | None = None
    ) -> EvaluationResult:
        """Runs the model functions over every task and computes its metrics.

        A task whose metrics cannot all be computed (no metric functions, a model output
        of the wrong length, a metric that raises) gets an entry in `errors`; the other
        tasks and metrics are still reported.
        """
        result = EvaluationResult()
        for name, data in self._data.items():
            self._evaluate_task(name, data, predict_fn, score_fn, step, result)
        for logger in self.loggers:
            for name, metrics in result.metrics.items():
                logger.log_metrics(name, step or 0, metrics)
            for name, data in self._data.items():
                logger.log_examples(name, step or 0, self._rows(name, data, result))
        return result

    def _ordered(
        self, name: str, kind: str, outputs: Sequence[tuple[int, Any]] | None, n: int, result: EvaluationResult
    ) -> list[Any] | None:
        if outputs is None:
            return None
        outputs = list(outputs)
        indices = sorted(int(i) for i, _ in outputs)
        if indices != list(range(n)):
            result._error(
                name,
                f"task {name!r}: the {kind} function returned {len(outputs)} "
                f"outputs for {n} examples (each index 0..{n - 1} exactly once)",
            )
            return None
        return [v for _, v in sorted(outputs, key=lambda pair: int(pair[0]))]

    def _evaluate_task(
        self,
        name: str,
        data: _TaskData,
        predict_fn: PredictFn | None,
        score_fn: ScoreFn | None,
        step: int | None,
        result: EvaluationResult,
    ) -> None:
        task, n = data.task, len(data.examples)
        objects = tuple(getattr(task, "metric_objs", ()))
        if not task.metric_fns and not objects:
            result._error(name, f"task {name!r} has no metric functions; nothing to report")
            return
        kinds = {_name(fn): metric_kind(fn) for fn in task.metric_fns}
        wanted = set(kinds.values()) | {metric_kind(m) for m in objects}
        predictions = scores = raw = None
        if "prediction" in wanted and predict_fn is not None:
            raw = self._ordered(name, "predict", predict_fn(data.model_dataset), n, result)
            if raw is not None:
                vocab = task.output_features["targets"].vocabulary
                predictions = [
                    self._postprocess(task, _text(vocab, ids), ex, False) for ids, ex in zip(raw, data.examples)
                ]
                result.predictions[name] = predictions
        if "score" in wanted and score_fn is not None:
            scores = self._ordered(name, "score", score_fn(data.model_dataset), n, result)
            if scores is not None:
                scores = [float(s) for s in scores]
                result.scores[name] = scores
        num_tokens = [int(np.size(ex["targets"])) for ex in data.examples] if "targets" in data.examples[0] else None
        metrics: dict[str, float] = {}
        for fn in task.metric_fns:
            metric, kind = _name(fn), kinds[_name(fn)]
            values = predictions if kind == "prediction" else scores if kind == "score" else None
            if kind == "unknown":
                result._error(name, f"task {name!r}: metric {metric} takes neither `predictions` nor `scores`")
                continue
            if values is None:
                missing = "predict_fn" if kind == "prediction" else "score_fn"
                result._error(
                    name, f"task {name!r}: metric {metric} needs {missing} outputs, which are missing or unusable"
                )
                continue
            kwargs: dict[str, Any] = {}
            params = inspect.signature(fn).parameters
            if "aux_values" in params:
                kwargs["aux_values"] = {}
            if "num_tokens" in params:
                kwargs["num_tokens"] = num_tokens
            try:
                out = fn(data.targets, values, **kwargs)
            except Exception as e:  # one bad metric must not hide the others
                result._error(name, f"task {name!r}: metric {metric} raised {type(e).__name__}: {e}")
                continue
            overlap = set(out) & set(metrics)
            if overlap:
                result._error(
                    name, f"task {name!r}: metric {metric} reports {sorted(overlap)} again; the first value is kept"
                )
            for k, v in out.items():
                metrics.setdefault(k, float(v))
        for obj in objects:
            out = self._compute_object(name, data, obj, raw, scores, result)
            for k, v in (out or {}).items():
                if k in metrics:
                    result._error(
                        name, f"task {name!r}: metric {obj.name} reports {k!r} again; the first value is kept"
                    )
                metrics.setdefault(k, float(v))
        if metrics:
            result.metrics[name] = metrics

    def _compute_object(
        self, name: str, data: _TaskData, obj: Any, raw: list | None, scores: list | None, result: EvaluationResult
    ) -> dict[str, float] | None:
        """A metric object over the task: built chunk by chunk, merged, computed."""
        kind = metric_kind(obj)
        outputs: Any = raw if kind == "prediction" else scores
        if outputs is None:
            missing = "predict_fn" if kind == "prediction" else "score_fn"
            result._error(
                name, f"task {name!r}: metric {obj.name} needs {missing} outputs, which are missing or unusable"
            )
            return None
        n = len(data.examples)
        step = self._chunk or n
        try:
            merged = None
            for start in range(0, n, step):
                stop = min(n, start + step)
                chunk: Any = outputs[start:stop]
                if int(obj.model_output_type) == 3:  # PREDICTION_WITH_AUX: (predictions, aux)
                    chunk = (chunk, {})
                indices = np.stack([np.zeros(stop - start, np.int32), np.arange(start, stop, dtype=np.int32)], 1)
                part = obj.from_model_output(
                    data.examples[start:stop], chunk, data.task.output_features, "targets", None, indices
                )
                merged = part if merged is None else merged.merge(part)
            return dict(merged.compute()) if merged is not None else None
        except Exception as e:  # one bad metric must not hide the others
            result._error(name, f"task {name!r}: metric {obj.name} raised {type(e).__name__}: {e}")
            return None

    def _rows(self, name: str, data: _TaskData, result: EvaluationResult) -> list[dict[str, Any]]:
        task = data.task
        rows = []
        for i, ex in enumerate(data.examples):
            row: dict[str, Any] = {"index": i, "targets": data.targets[i]}
            if "inputs_pretokenized" in ex:
                row["inputs"] = ex["inputs_pretokenized"]
            elif "inputs" in ex and "inputs" in task.output_features:
                row["inputs"] = _text(task.output_features["inputs"].vocabulary, ex["inputs"])
            if name in result.predictions:
                row["prediction"] = result.predictions[name][i]
            if name in result.scores:
                row["score"] = result.scores[name][i]
            rows.append(row)
        return rows
