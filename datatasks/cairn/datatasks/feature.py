"""`Feature`: how one output feature of a task is tokenized and checked."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cairn.datatasks.lazy_tf import tf
from cairn.tokenizers import PassThroughVocabulary, Vocabulary


@dataclasses.dataclass(frozen=True)
class Feature:
    """An output feature (seqio's `Feature`).

    Attributes:
      vocabulary: tokenizes and decodes the feature.
      add_eos: `append_eos` / `append_eos_after_trim` add the vocabulary's EOS.
      required: the feature must be present after preprocessing.
      dtype: the dtype after preprocessing (int32 for token ids): a name ("int32",
        "string", ...), a NumPy dtype or a `tf.DType`; kept as its name (a `tf.DType`
        compares equal to its name), so no TensorFlow is imported to declare a feature.
      rank: the rank after preprocessing (1 for a token sequence).
      token_ids: the source gives this feature as token ids already: `tokenize` leaves it
        (without it, ids where the vocabulary expects text are an error naming the feature).
    """

    vocabulary: Vocabulary
    add_eos: bool = True
    required: bool = True
    dtype: Any = "int32"
    rank: int = 1
    token_ids: bool = False

    def __post_init__(self):
        if not isinstance(self.vocabulary, Vocabulary):
            raise TypeError(
                f"Feature.vocabulary must be a cairn.tokenizers.Vocabulary, got {type(self.vocabulary).__name__}"
            )
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Feature.rank must be a non-negative int, got {self.rank!r}")

    @property
    def tf_dtype(self) -> tf.DType:
        """`dtype` as a `tf.DType` (imports TensorFlow)."""
        return tf.dtypes.as_dtype(self.dtype)


def dtype_name(dtype: Any) -> str:
    """The name of `dtype` (a name, NumPy dtype or type, or `tf.DType`) without TensorFlow."""
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__.startswith("tensorflow"):
        name = dtype.name
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError as e:
            raise ValueError(f"Feature.dtype must be a dtype or its name, got {dtype!r}") from e
    if name in ("str", "bytes", "object", "bytes_"):
        name = "string"
    return name


def passthrough_feature(size: int = 1 << 20, **kwargs) -> Feature:
    """A feature whose values are already ids (no tokenization)."""
    return Feature(PassThroughVocabulary(size, eos_id=kwargs.pop("eos_id", 1)), **kwargs)
