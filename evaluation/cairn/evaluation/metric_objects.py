"""seqio-style metric objects: built from a model's output, merged, then computed.

A `Metric` is what seqio's `Task(metric_objs=[...])` holds: `from_model_output(inputs,
model_output, features, target_field_name, mask, indices_2d)` builds an instance from the
task's examples and the model's outputs (token ids or scores, in example order),
`merge(other)` combines two instances (batches, hosts), and `compute()` returns named floats.
Plain metric functions (`Task(metric_fns=...)`) keep working; `LegacyMetric` wraps one as an
object. Cairn's objects are plain Python (seqio's are `clu.metrics.Metric` flax dataclasses),
so evaluation still loads no JAX.

Provided: `LegacyMetric` (any metric function, collecting targets and outputs), `Accuracy`
(prediction text equal to the target, as `metrics.accuracy`) and `Perplexity` (scores over
target tokens, as `metrics.perplexity`); both of those merge by adding counts.
"""

from __future__ import annotations

import abc
import enum
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cairn.evaluation.metrics._checks import MetricInputError


class ModelOutputType(enum.IntEnum):
    """Which model function a metric object reads (seqio's names and values)."""

    PREDICTION = 1
    SCORE = 2
    PREDICTION_WITH_AUX = 3
    SCORE_WITH_INTERMEDIATES = 4


def _selected(items: Sequence[Any], mask: np.ndarray | None) -> list[Any]:
    if mask is None:
        return list(items)
    mask = np.asarray(mask, bool)
    if mask.shape != (len(items),):
        raise MetricInputError(f"mask has shape {mask.shape}, expected ({len(items)},)")
    return [x for x, keep in zip(items, mask) if keep]


def decode(features: Mapping[str, Any], field: str, ids: Any) -> str:
    """Token ids of `field` as text (its feature's vocabulary)."""
    out = features[field].vocabulary.decode(np.asarray(ids).tolist())
    return out if isinstance(out, str) else str(out)


def target_texts(inputs: Sequence[Mapping[str, Any]], features: Mapping[str, Any], field: str = "targets") -> list[str]:
    """Each example's target text: `<field>_pretokenized` when present, else its ids decoded."""
    out = []
    for ex in inputs:
        raw = ex.get(f"{field}_pretokenized")
        if raw is None:
            out.append(decode(features, field, ex[field]))
        else:
            out.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    return out


class Metric(abc.ABC):
    """A seqio-style metric object. Subclasses set `model_output_type` and implement
    `from_model_output`, `merge` and `compute`."""

    model_output_type: ModelOutputType = ModelOutputType.PREDICTION

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def from_model_output(
        self,
        inputs: Sequence[Mapping[str, Any]],
        model_output: Any,
        features: Mapping[str, Any],
        target_field_name: str = "targets",
        mask: np.ndarray | None = None,
        indices_2d: np.ndarray | None = None,
    ) -> Metric:
        """A new instance holding what `compute` needs from these examples and outputs
        (`mask`: which examples count; `indices_2d`: `[n, 2]` (shard, index) of each)."""

    @abc.abstractmethod
    def merge(self, other: Metric) -> Metric:
        """The instance of both (neither is changed)."""

    @abc.abstractmethod
    def compute(self) -> dict[str, float]:
        """The metric values."""


class _Counts(Metric):
    """A metric that is a ratio of sums: `merge` adds them."""

    def __init__(self, numerator: float = 0.0, denominator: float = 0.0):
        self.numerator, self.denominator = float(numerator), float(denominator)

    def merge(self, other: Metric) -> Metric:
        if type(other) is not type(self):
            raise MetricInputError(f"{self.name}.merge: cannot merge a {type(other).__name__}")
        assert isinstance(other, _Counts)
        return type(self)(self.numerator + other.numerator, self.denominator + other.denominator)


class Accuracy(_Counts):
    """Percentage of decoded predictions equal to their target text (0-100)."""

    model_output_type = ModelOutputType.PREDICTION

    def from_model_output(
        self, inputs, model_output, features, target_field_name="targets", mask=None, indices_2d=None
    ):
        targets = target_texts(inputs, features, target_field_name)
        if len(targets) != len(model_output):
            raise MetricInputError(f"Accuracy: {len(targets)} examples but {len(model_output)} predictions")
        pairs = _selected(list(zip(targets, model_output)), mask)
        hits = sum(t == decode(features, target_field_name, p) for t, p in pairs)
        return Accuracy(hits, len(pairs))

    def compute(self) -> dict[str, float]:
        if not self.denominator:
            raise MetricInputError("Accuracy: no examples")
        return {"accuracy": 100.0 * self.numerator / self.denominator}


class Perplexity(_Counts):
    """Corpus perplexity of the targets: exp(-sum of scores / target tokens, EOS included)."""

    model_output_type = ModelOutputType.SCORE

    def from_model_output(
        self, inputs, model_output, features, target_field_name="targets", mask=None, indices_2d=None
    ):
        if len(inputs) != len(model_output):
            raise MetricInputError(f"Perplexity: {len(inputs)} examples but {len(model_output)} scores")
        pairs = _selected(list(zip(inputs, model_output)), mask)
        nll = -sum(float(s) for _, s in pairs)
        return Perplexity(nll, sum(int(np.size(ex[target_field_name])) for ex, _ in pairs))

    def compute(self) -> dict[str, float]:
        if self.denominator <= 0:
            raise MetricInputError("Perplexity: the targets hold no tokens")
        per_token = self.numerator / self.denominator
        return {"perplexity": math.exp(per_token), "nll_per_token": per_token}


def metric_kind(metric: Any) -> str:
    """`prediction`, `score` or `unknown`: a metric object by its `model_output_type`, a
    metric function by its signature names (seqio's rule)."""
    output_type = getattr(metric, "model_output_type", None)
    if output_type is not None:
        scores = (ModelOutputType.SCORE, ModelOutputType.SCORE_WITH_INTERMEDIATES)
        return "score" if output_type in scores else "prediction"
    params = inspect.signature(metric).parameters
    return "score" if "scores" in params else "prediction" if "predictions" in params else "unknown"


def _output_type(metric_fn: Callable) -> ModelOutputType:
    params = inspect.signature(metric_fn).parameters
    if "scores" in params:
        return ModelOutputType.SCORE
    if "predictions" in params:
        return ModelOutputType.PREDICTION_WITH_AUX if "aux_values" in params else ModelOutputType.PREDICTION
    raise MetricInputError(
        f"metric function {getattr(metric_fn, '__name__', metric_fn)!r} takes neither `predictions` nor `scores`"
    )


class LegacyMetric(Metric):
    """A metric function as an object (seqio's `LegacyMetric`): collects the postprocessed
    targets and the model outputs (predictions decoded and postprocessed), merges by
    concatenating, and calls the function on everything in `compute`."""

    def __init__(
        self,
        metric_fn: Callable[..., Mapping[str, float]],
        postprocess_fn: Callable[..., Any] | None = None,
        collected: tuple[list[Any], list[Any], list[int]] | None = None,
    ):
        self.metric_fn, self.postprocess_fn = metric_fn, postprocess_fn
        self.model_output_type = _output_type(metric_fn)
        self.targets, self.values, self.num_tokens = collected or ([], [], [])

    @classmethod
    def empty(cls, metric_fn: Callable[..., Mapping[str, float]], postprocess_fn: Callable | None = None):
        return cls(metric_fn, postprocess_fn)

    @property
    def name(self) -> str:
        return getattr(self.metric_fn, "__name__", type(self.metric_fn).__name__)

    def _post(self, value: Any, example: Mapping[str, Any], is_target: bool) -> Any:
        return (
            value if self.postprocess_fn is None else self.postprocess_fn(value, example=example, is_target=is_target)
        )

    def from_model_output(
        self, inputs, model_output, features, target_field_name="targets", mask=None, indices_2d=None
    ):
        if self.model_output_type == ModelOutputType.PREDICTION_WITH_AUX:
            model_output = model_output[0]
        if len(inputs) != len(model_output):
            raise MetricInputError(f"{self.name}: {len(inputs)} examples but {len(model_output)} model outputs")
        kept = _selected(list(zip(inputs, target_texts(inputs, features, target_field_name), model_output)), mask)
        targets = [self._post(t, ex, True) for ex, t, _ in kept]
        if self.model_output_type == ModelOutputType.SCORE:
            values = [float(v) for _, _, v in kept]
        else:
            values = [self._post(decode(features, target_field_name, v), ex, False) for ex, _, v in kept]
        tokens = [int(np.size(ex[target_field_name])) for ex, _, _ in kept]
        return LegacyMetric(self.metric_fn, self.postprocess_fn, (targets, values, tokens))

    def merge(self, other: Metric) -> Metric:
        if not isinstance(other, LegacyMetric) or other.metric_fn is not self.metric_fn:
            raise MetricInputError(f"{self.name}.merge: cannot merge another metric ({other.name})")
        collected = (self.targets + other.targets, self.values + other.values, self.num_tokens + other.num_tokens)
        return LegacyMetric(self.metric_fn, self.postprocess_fn, collected)

    def compute(self) -> dict[str, float]:
        params = inspect.signature(self.metric_fn).parameters
        kwargs: dict[str, Any] = {}
        if "aux_values" in params:
            kwargs["aux_values"] = {}
        if "num_tokens" in params:
            kwargs["num_tokens"] = self.num_tokens
        return {k: float(v) for k, v in self.metric_fn(self.targets, self.values, **kwargs).items()}
