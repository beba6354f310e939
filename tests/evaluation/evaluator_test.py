"""The Evaluator over two registered tasks and a mixture, with a fake model function."""

import json
import random

import numpy as np
import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.evaluation import EvaluationError, Evaluator, JsonLinesLogger, metrics
from cairn.tokenizers import ByteVocabulary

VOCAB = ByteVocabulary()
QA = [
    ("capital of france", "Paris"),
    ("two plus two", "four"),
    ("color of sky", "blue"),
    ("opposite of hot", "cold"),
    ("first letter", "a b c"),
    ("largest planet", "Jupiter"),
]
# The fake model answers these, wrong on purpose for examples 1 and 4.
ANSWERS = ["Paris", "five", "blue", "cold", "a b", "Jupiter"]
SIMILARITY = [("a", 1.0), ("bb", 2.5), ("ccc", 2.5), ("dddd", 4.0), ("eeeee", 0.5)]


def _qa_fn(split, shuffle_files):
    return tf.data.Dataset.from_tensor_slices({"question": [q for q, _ in QA], "answer": [a for _, a in QA]})


def _sim_fn(split, shuffle_files):
    return tf.data.Dataset.from_tensor_slices(
        {"text": [t for t, _ in SIMILARITY], "label": [str(v) for _, v in SIMILARITY]}
    )


def _float_postprocess(text, example=None, is_target=False):
    try:
        return float(text)
    except ValueError:
        return -1.0


def _broken_metric(targets, predictions):
    raise RuntimeError("boom")


def _unusable_metric(targets, whatever):
    return {}


@pytest.fixture
def registry():
    reg = dt.Registry()
    features = {"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)}
    reg.add_task(
        dt.Task(
            "qa",
            dt.FunctionDataSource(_qa_fn, splits=["validation"]),
            preprocessors=[
                lambda ds: dt.preprocessors.rekey(ds, {"inputs": "question", "targets": "answer"}),
                dt.preprocessors.tokenize,
                dt.preprocessors.append_eos,
            ],
            output_features=features,
            metric_fns=[metrics.accuracy, metrics.squad, metrics.bleu, metrics.rouge, metrics.perplexity],
        )
    )
    reg.add_task(
        dt.Task(
            "similarity",
            dt.FunctionDataSource(_sim_fn, splits=["validation"]),
            preprocessors=[
                lambda ds: dt.preprocessors.rekey(ds, {"inputs": "text", "targets": "label"}),
                dt.preprocessors.tokenize,
                dt.preprocessors.append_eos,
            ],
            output_features=features,
            postprocess_fn=_float_postprocess,
            metric_fns=[metrics.pearson_corrcoef, metrics.spearman_corrcoef],
        )
    )
    reg.add_mixture(dt.Mixture("both", ["qa", "similarity"], default_rate=1.0, registry=reg))
    return reg


def _fake_model(answer_for_task):
    """A predict_fn returning (index, token ids) pairs, shuffled, with EOS and padding."""

    def predict_fn(ds):
        outputs = []
        for index, features in ds.as_numpy_iterator():
            text = answer_for_task(int(index), features)
            outputs.append((int(index), VOCAB.encode(text) + [VOCAB.eos_id, 0, 0]))
        random.Random(0).shuffle(outputs)
        return outputs

    return predict_fn


def _qa_answer(index, features):
    return ANSWERS[index]


def _sim_answer(index, features):
    # Prediction: number of non-pad input tokens minus one (EOS) as the "similarity".
    return str(float(np.count_nonzero(features["encoder_input_tokens"]) - 1))


def _score_fn(ds):
    return [(int(i), -1.0 * (int(i) + 1)) for i, _ in ds.as_numpy_iterator()][::-1]


def test_metrics_of_two_tasks_and_a_mixture(registry, tmp_path):
    conv = dt.EncDecFeatureConverter(pack=False)
    evaluator = Evaluator("both", conv, split="validation", registry=registry, loggers=[JsonLinesLogger(tmp_path)])
    assert evaluator.task_names == ["qa", "similarity"]

    def predict_fn(ds):
        first = next(iter(ds))[1]["encoder_input_tokens"].numpy()
        is_qa = VOCAB.decode(first).startswith("capital")
        return _fake_model(_qa_answer if is_qa else _sim_answer)(ds)

    result = evaluator.evaluate(predict_fn=predict_fn, score_fn=_score_fn, step=10)
    qa, sim = result.metrics["qa"], result.metrics["similarity"]

    # Independent computations.
    targets = [a for _, a in QA]
    assert qa["accuracy"] == pytest.approx(100 * 4 / 6)
    import sacrebleu
    from rouge_score import rouge_scorer

    assert qa["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(ANSWERS, [targets], smooth_method="exp", smooth_value=0.0, tokenize="intl").score
    )
    scorer = rouge_scorer.RougeScorer(["rouge1"])
    assert qa["rouge1"] == pytest.approx(
        100 * np.mean([scorer.score(t, p)["rouge1"].fmeasure for t, p in zip(targets, ANSWERS)])
    )
    # squad: EM 4/6; F1 for "a b" vs "a b c": normalized drops the article "a" -> "b" vs "b c": 2/3
    assert qa["em"] == pytest.approx(100 * 4 / 6)
    assert qa["f1"] == pytest.approx(100 * (4 + 0 + 2 / 3) / 6)
    # perplexity: scores -1..-6, tokens = bytes + EOS per target
    tokens = sum(len(a.encode()) + 1 for a in targets)
    assert qa["perplexity"] == pytest.approx(np.exp(21 / tokens))

    from scipy import stats

    gold = [v for _, v in SIMILARITY]
    pred = [float(len(t)) for t, _ in SIMILARITY]
    assert sim["pearson_corrcoef"] == pytest.approx(100 * stats.pearsonr(gold, pred)[0])
    assert sim["spearman_corrcoef"] == pytest.approx(100 * stats.spearmanr(gold, pred)[0])
    assert result.errors == {}
    assert result.predictions["qa"] == ANSWERS

    rows = [json.loads(x) for x in (tmp_path / "examples" / "qa-00000010.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == ANSWERS
    assert rows[0]["inputs"] == "capital of france" and rows[0]["score"] == -1.0
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"task": "similarity", "step": 10, "metric": "pearson_corrcoef", "value": sim["pearson_corrcoef"]} in logged


def test_order_is_restored_from_indices(registry):
    conv = dt.EncDecFeatureConverter(pack=False)
    evaluator = Evaluator("qa", conv, split="validation", registry=registry)
    in_order = _fake_model(_qa_answer)

    def sorted_fn(ds):
        return sorted(in_order(ds))

    a = evaluator.evaluate(predict_fn=in_order, score_fn=_score_fn)
    b = evaluator.evaluate(predict_fn=sorted_fn, score_fn=_score_fn)
    assert a.metrics == b.metrics
    assert a.predictions == b.predictions


def test_bad_outputs_and_metrics_are_reported_per_task(registry):
    registry.add_task(
        dt.Task(
            "no_metrics",
            dt.FunctionDataSource(_qa_fn, splits=["validation"]),
            preprocessors=[
                lambda ds: dt.preprocessors.rekey(ds, {"inputs": "question", "targets": "answer"}),
                dt.preprocessors.tokenize,
            ],
            output_features={"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)},
        )
    )
    registry.add_task(
        dt.Task(
            "flaky",
            dt.FunctionDataSource(_qa_fn, splits=["validation"]),
            preprocessors=[
                lambda ds: dt.preprocessors.rekey(ds, {"inputs": "question", "targets": "answer"}),
                dt.preprocessors.tokenize,
            ],
            output_features={"inputs": dt.Feature(VOCAB), "targets": dt.Feature(VOCAB)},
            metric_fns=[_broken_metric, metrics.accuracy, _unusable_metric],
        )
    )
    registry.add_mixture(dt.Mixture("all3", ["qa", "no_metrics", "flaky"], default_rate=1.0, registry=registry))
    evaluator = Evaluator("all3", dt.EncDecFeatureConverter(pack=False), registry=registry)

    calls = []

    def short_for_qa(ds):
        # Tasks run in name order: flaky, no_metrics (no metrics, so no call), qa.
        calls.append(1)
        out = _fake_model(_qa_answer)(ds)
        return out[:-1] if len(calls) == 2 else out

    result = evaluator.evaluate(predict_fn=short_for_qa)
    assert "flaky" in result.metrics and result.metrics["flaky"]["accuracy"] == pytest.approx(100 * 4 / 6)
    flaky = " ".join(result.errors["flaky"])
    assert "task 'flaky': metric _broken_metric raised RuntimeError: boom" in flaky
    assert "metric _unusable_metric takes neither" in flaky
    assert result.errors["no_metrics"] == ["task 'no_metrics' has no metric functions; nothing to report"]
    qa_errors = " ".join(result.errors["qa"])
    assert "task 'qa': the predict function returned 5 outputs for 6 examples" in qa_errors
    assert "qa" not in result.metrics or "accuracy" not in result.metrics["qa"]


def test_construction_errors(registry):
    with pytest.raises(EvaluationError, match="pack=False"):
        Evaluator("qa", dt.EncDecFeatureConverter(pack=True), registry=registry)
    with pytest.raises(EvaluationError, match="split 'test'"):
        Evaluator("qa", dt.EncDecFeatureConverter(pack=False), split="test", registry=registry)
    with pytest.raises(dt.UnknownNameError):
        Evaluator("qaa", dt.EncDecFeatureConverter(pack=False), registry=registry)


def test_num_examples_limits_each_task(registry):
    evaluator = Evaluator("both", dt.EncDecFeatureConverter(pack=False), registry=registry, num_examples=3)
    assert [len(evaluator.examples(t)) for t in evaluator.task_names] == [3, 3]
    assert evaluator.targets("qa") == ["Paris", "four", "blue"]
