"""BLEU (sacrebleu) and ROUGE (rouge-score): the reference implementations, imported lazily.

Why these libraries: BLEU and ROUGE have many subtly different implementations; sacrebleu
and Google's rouge-score are the ones T5's published numbers use, so our numbers compare.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cairn.evaluation.metrics._checks import MetricInputError, same_length


def bleu(
    targets: Sequence[str | Sequence[str]], predictions: Sequence[str], tokenizer: str = "intl"
) -> dict[str, float]:
    """Corpus BLEU with T5's settings (exp smoothing, intl tokenizer, no lowercasing).

    Targets are strings, or lists of references (all of equal count).
    """
    import sacrebleu

    same_length("bleu", targets, predictions)
    references: list[list[str]]
    if isinstance(targets[0], str):
        references = [[str(t) for t in targets]]
    else:
        counts = {len(t) for t in targets}
        if len(counts) != 1:
            raise MetricInputError(f"bleu: every example needs the same number of references, got {sorted(counts)}")
        references = [[str(x) for x in r] for r in zip(*targets)]
    score = sacrebleu.corpus_bleu(
        list(predictions),
        references,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenizer,
        use_effective_order=False,
    )
    return {"bleu": float(score.score)}


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeL", "rougeLsum"),
    use_stemmer: bool = False,
) -> dict[str, float]:
    """Mean ROUGE F-measure per key, in percent.

    T5 aggregates with rouge-score's BootstrapAggregator (its "mid" value is an estimate of
    this mean from unseeded resampling); the plain mean is exact and deterministic. As T5
    does, " . " becomes a newline so rougeLsum sees sentences.
    """
    from rouge_score import rouge_scorer

    same_length("rouge", targets, predictions)
    scorer = rouge_scorer.RougeScorer(list(score_keys), use_stemmer=use_stemmer)
    totals: dict[str, list[float]] = {k: [] for k in score_keys}
    for t, p in zip(targets, predictions):
        scores = scorer.score(target=t.replace(" . ", " .\n"), prediction=p.replace(" . ", " .\n"))
        for k in score_keys:
            totals[k].append(scores[k].fmeasure)
    return {k: 100.0 * float(np.mean(v)) for k, v in totals.items()}
