"""`Feature`: how one output feature of a task is tokenized and checked."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from cairn.tokenizers import PassThroughVocabulary, Vocabulary


@dataclasses.dataclass(frozen=True)
class Feature:
    """An output feature (seqio's `Feature`).

    Attributes:
      vocabulary: tokenizes and decodes the feature.
      add_eos: `append_eos` / `append_eos_after_trim` add the vocabulary's EOS.
      required: the feature must be present after preprocessing.
      dtype: the dtype after preprocessing (int32 for token ids).
      rank: the rank after preprocessing (1 for a token sequence).
    """

    vocabulary: Vocabulary
    add_eos: bool = True
    required: bool = True
    dtype: Any = tf.int32
    rank: int = 1

    def __post_init__(self):
        if not isinstance(self.vocabulary, Vocabulary):
            raise TypeError(
                f"Feature.vocabulary must be a cairn.tokenizers.Vocabulary, got {type(self.vocabulary).__name__}"
            )
        object.__setattr__(self, "dtype", tf.dtypes.as_dtype(self.dtype))
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Feature.rank must be a non-negative int, got {self.rank!r}")


def passthrough_feature(size: int = 1 << 20, **kwargs) -> Feature:
    """A feature whose values are already ids (no tokenization)."""
    return Feature(PassThroughVocabulary(size, eos_id=kwargs.pop("eos_id", 1)), **kwargs)
