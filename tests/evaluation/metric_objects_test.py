"""seqio-style metric objects: from_model_output, merge, compute; through the Evaluator beside
metric functions, chunked and merged, with the same values as the functions."""

import random

import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.evaluation import Evaluator, LegacyMetric, Metric, ModelOutputType, metric_objects, metrics
from cairn.evaluation.metrics._checks import MetricInputError
from cairn.tokenizers import ByteVocabulary

VOCAB = ByteVocabulary()
FEATURES = {"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)}
QA = [("capital of france", "Paris"), ("two plus two", "four"), ("sky", "blue"), ("hot", "cold"), ("abc", "a b c")]
ANSWERS = ["Paris", "five", "blue", "cold", "a b"]  # 3 of 5 right


def _qa_fn(split, shuffle_files):
    return tf.data.Dataset.from_tensor_slices({"inputs": [q for q, _ in QA], "targets": [a for _, a in QA]})


class CountCharacters(Metric):
    """A user's metric object: mean predicted length in characters (sum / count; merges by adding)."""

    model_output_type = ModelOutputType.PREDICTION

    def __init__(self, total=0, count=0):
        self.total, self.count = total, count

    def from_model_output(
        self, inputs, model_output, features, target_field_name="targets", mask=None, indices_2d=None
    ):
        texts = [metric_objects.decode(features, target_field_name, ids) for ids in model_output]
        return CountCharacters(sum(len(t) for t in texts), len(texts))

    def merge(self, other):
        return CountCharacters(self.total + other.total, self.count + other.count)

    def compute(self):
        return {"mean_chars": self.total / self.count}


def _task(**kw):
    return dt.Task(
        "qa_objs",
        dt.FunctionDataSource(_qa_fn, splits=["validation"]),
        output_features=FEATURES,
        preprocessors=[dt.preprocessors.tokenize, dt.preprocessors.append_eos],
        **kw,
    )


def _predict(ds):
    out = [(int(i), VOCAB.encode(ANSWERS[int(i)]) + [VOCAB.eos_id, 0]) for i, _ in ds.as_numpy_iterator()]
    random.Random(1).shuffle(out)
    return out


def _score(ds):
    return [(int(i), -2.0 - int(i)) for i, _ in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def by_fns():
    """The metric functions' results: the same for every chunk size, so computed once."""
    return Evaluator(
        _task(metric_fns=[metrics.accuracy, metrics.perplexity, metrics.bleu]), dt.EncDecFeatureConverter(pack=False)
    ).evaluate(predict_fn=_predict, score_fn=_score)


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_objects_equal_the_functions_through_the_evaluator(chunk, by_fns):
    objs = [
        metric_objects.Accuracy(),
        metric_objects.Perplexity(),
        LegacyMetric.empty(metrics.bleu),
        CountCharacters(),
    ]
    by_objects = Evaluator(
        _task(metric_objs=objs), dt.EncDecFeatureConverter(pack=False), metric_chunk_size=chunk
    ).evaluate(predict_fn=_predict, score_fn=_score)
    got, want = by_objects.metrics["qa_objs"], by_fns.metrics["qa_objs"]
    assert by_objects.errors == {}
    assert got["accuracy"] == pytest.approx(60.0) == pytest.approx(want["accuracy"])
    assert got["perplexity"] == pytest.approx(want["perplexity"]) and got["bleu"] == pytest.approx(want["bleu"])
    assert got["mean_chars"] == pytest.approx(sum(map(len, ANSWERS)) / 5)


def test_merge_and_mask_by_hand():
    examples = [{"targets": VOCAB.encode(t) + [1]} for t in ("ab", "cd", "ef")]
    preds = [VOCAB.encode(t) + [1] for t in ("ab", "xx", "ef")]
    acc = metric_objects.Accuracy()
    whole = acc.from_model_output(examples, preds, FEATURES)
    parts = acc.from_model_output(examples[:1], preds[:1], FEATURES).merge(
        acc.from_model_output(examples[1:], preds[1:], FEATURES)
    )
    assert whole.compute() == parts.compute() == {"accuracy": pytest.approx(200 / 3)}
    masked = acc.from_model_output(examples, preds, FEATURES, mask=[True, False, True])
    assert masked.compute() == {"accuracy": 100.0}
    ppl = metric_objects.Perplexity().from_model_output(examples, [-3.0, -3.0, -3.0], FEATURES)
    assert ppl.compute()["nll_per_token"] == pytest.approx(1.0)  # 9 nats over 3 x 3 tokens
    legacy = LegacyMetric.empty(metrics.sequence_accuracy)
    assert legacy.model_output_type == ModelOutputType.PREDICTION
    assert LegacyMetric.empty(metrics.perplexity).model_output_type == ModelOutputType.SCORE


def test_bad_metric_objects_are_named():
    with pytest.raises(MetricInputError, match="cannot merge a Perplexity"):
        metric_objects.Accuracy().merge(metric_objects.Perplexity())
    with pytest.raises(MetricInputError, match="2 examples but 1 predictions"):
        metric_objects.Accuracy().from_model_output([{"targets": [5]}] * 2, [[5]], FEATURES)
    with pytest.raises(MetricInputError, match="takes neither `predictions` nor `scores`"):
        LegacyMetric.empty(lambda targets, outputs: {})
    with pytest.raises(dt.DataTasksError, match="metric object .* has no from_model_output"):
        _task(metric_objs=[metrics.accuracy])


def test_a_failing_object_does_not_hide_the_others():
    class Broken(CountCharacters):
        def from_model_output(self, *args, **kwargs):
            raise RuntimeError("boom")

    result = Evaluator(
        _task(metric_objs=[Broken(), metric_objects.Accuracy(), metric_objects.Perplexity()]),
        dt.EncDecFeatureConverter(pack=False),
    ).evaluate(predict_fn=_predict)
    assert result.metrics["qa_objs"] == {"accuracy": pytest.approx(60.0)}
    assert any("metric Broken raised RuntimeError: boom" in e for e in result.errors["qa_objs"])
    assert any("metric Perplexity needs score_fn outputs" in e for e in result.errors["qa_objs"])
