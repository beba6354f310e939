import math

import numpy as np
import pytest

from cairn.evaluation import metrics
from cairn.evaluation.metrics._checks import MetricInputError

TARGETS = ["the cat sat on the mat", "a quick brown fox", "to be or not to be", "hello world"]
PREDICTIONS = ["the cat sat on a mat", "a quick brown fox", "to be or to be", "goodbye world"]


def test_accuracy_and_sequence_accuracy_by_hand():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == {"accuracy": 50.0}
    assert metrics.sequence_accuracy([[1, 2], [3], [4, 5]], [[1, 2], [3, 0], [4, 5]]) == {
        "sequence_accuracy": pytest.approx(200 / 3)
    }
    assert metrics.sequence_accuracy(TARGETS, PREDICTIONS) == {"sequence_accuracy": 25.0}


def test_exact_match_with_several_references():
    got = metrics.exact_match([["Paris", "paris, France"], "42", "x"], [" Paris ", "41", "x"])
    assert got == {"exact_match": pytest.approx(200 / 3)}


def test_squad_em_and_f1_by_hand():
    targets = [["The Eiffel Tower", "Eiffel tower"], ["in 1889"], ["Gustave Eiffel"]]
    predictions = ["eiffel tower!", "1889", "Alexandre Gustave Eiffel"]
    got = metrics.squad(targets, predictions)
    # Normalized: "eiffel tower" == "eiffel tower"  -> em 1, f1 1
    #             "in 1889" vs "1889"                -> em 0, f1: p=1, r=1/2 -> 2/3
    #             "gustave eiffel" vs "alexandre gustave eiffel" -> p=2/3, r=1 -> 0.8
    assert got["em"] == pytest.approx(100 / 3)
    assert got["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0.8) / 3)
    assert metrics.normalize_squad("The  Cat, a dog!") == "cat dog"


def test_bleu_equals_sacrebleu_called_directly():
    import sacrebleu

    expected = sacrebleu.corpus_bleu(
        PREDICTIONS,
        [TARGETS],
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize="intl",
        use_effective_order=False,
    ).score
    assert metrics.bleu(TARGETS, PREDICTIONS) == {"bleu": pytest.approx(expected)}
    assert 0 < expected < 100
    multi = metrics.bleu([[t, t.upper()] for t in TARGETS], PREDICTIONS)
    direct = sacrebleu.corpus_bleu(
        PREDICTIONS, [TARGETS, [t.upper() for t in TARGETS]], smooth_method="exp", smooth_value=0.0, tokenize="intl"
    ).score
    assert multi["bleu"] == pytest.approx(direct)


def test_rouge_equals_rouge_score_called_directly():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"])
    direct = [scorer.score(t, p) for t, p in zip(TARGETS, PREDICTIONS)]
    got = metrics.rouge(TARGETS, PREDICTIONS)
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert got[key] == pytest.approx(100 * np.mean([d[key].fmeasure for d in direct]))
    assert got["rouge1"] > got["rouge2"]


def test_correlations_equal_scipy():
    from scipy import stats

    t = [1.0, 2.5, 2.5, 4.0, 0.5, 3.0]
    p = [1.2, 2.0, 3.1, 3.9, 0.1, 3.0]
    assert metrics.pearson_corrcoef(t, p)["pearson_corrcoef"] == pytest.approx(100 * stats.pearsonr(t, p)[0])
    assert metrics.spearman_corrcoef(t, p)["spearman_corrcoef"] == pytest.approx(100 * stats.spearmanr(t, p)[0])


def test_perplexity_from_scores():
    scores = [-2.0, -4.0, -6.0]
    tokens = [2, 3, 5]
    got = metrics.perplexity(["a", "b", "c"], scores, tokens)
    assert got["perplexity"] == pytest.approx(math.exp(12.0 / 10))
    assert metrics.mean_log_likelihood(["a", "b", "c"], scores) == {"mean_log_likelihood": -4.0}


def test_bad_inputs_name_the_metric():
    with pytest.raises(MetricInputError, match="accuracy: 2 targets but 1 predictions"):
        metrics.accuracy([1, 2], [1])
    with pytest.raises(MetricInputError, match="bleu: no examples"):
        metrics.bleu([], [])
    with pytest.raises(MetricInputError, match="pearson_corrcoef: predictions must be numbers"):
        metrics.pearson_corrcoef([1, 2], ["x", 2])
    with pytest.raises(MetricInputError, match="perplexity: the targets hold no tokens"):
        metrics.perplexity(["a"], [0.0], [0])
    with pytest.raises(MetricInputError, match="same number of references"):
        metrics.bleu([["a", "b"], ["c"]], ["a", "c"])
