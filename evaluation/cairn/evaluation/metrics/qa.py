"""SQuAD-style exact match and token F1 (the official SQuAD v1.1 evaluation's definitions)."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np

from cairn.evaluation.metrics._checks import same_length

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_squad(text: str) -> str:
    """Lower-cases, removes punctuation and the articles a/an/the, collapses whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(reference: str, prediction: str) -> float:
    ref, pred = reference.split(), prediction.split()
    common = collections.Counter(ref) & collections.Counter(pred)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[str | Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """`{"em", "f1"}` in percent, each maximised over a question's reference answers."""
    same_length("squad", targets, predictions)
    em, f1 = [], []
    for t, p in zip(targets, predictions):
        refs = [normalize_squad(r) for r in ([t] if isinstance(t, str) else t)]
        pred = normalize_squad(p)
        em.append(max(float(r == pred) for r in refs))
        f1.append(max(_f1(r, pred) for r in refs))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}
