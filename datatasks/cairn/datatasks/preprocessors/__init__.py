"""Preprocessors: callables `dataset -> dataset` that a `Task` applies in order.

Built-ins are `Preprocessor` objects (declared features, length rules); plain functions
are accepted anywhere and wrapped by `as_preprocessor` when their rules are asked for.
"""

from cairn.datatasks.preprocessors.base import (
    LengthRule,
    Preprocessor,
    as_preprocessor,
    cacheable_prefix,
    is_deterministic,
    map_over_dataset,
    preprocessor,
)
from cairn.datatasks.preprocessors.basic import (
    append_eos,
    append_eos_after_trim,
    eos_after_trim_lengths,
    eos_lengths,
    random_crop,
    rekey,
    tokenize,
    trim,
    trim_lengths,
)
from cairn.datatasks.preprocessors.prefix_lm import prefix_lm, prefix_lm_one_to_one, random_prefix_noise_mask
from cairn.datatasks.preprocessors.span_corruption import (
    denoise,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
    reduce_concat_tokens,
    select_random_chunk,
    span_corruption,
    span_corruption_lengths,
    span_corruption_one_to_one,
    span_corruption_rule,
    split_tokens,
)

__all__ = [
    "LengthRule",
    "Preprocessor",
    "append_eos",
    "append_eos_after_trim",
    "as_preprocessor",
    "cacheable_prefix",
    "denoise",
    "eos_after_trim_lengths",
    "eos_lengths",
    "is_deterministic",
    "map_over_dataset",
    "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel",
    "prefix_lm",
    "prefix_lm_one_to_one",
    "preprocessor",
    "random_crop",
    "random_prefix_noise_mask",
    "random_spans_helper",
    "random_spans_noise_mask",
    "reduce_concat_tokens",
    "rekey",
    "select_random_chunk",
    "span_corruption",
    "span_corruption_lengths",
    "span_corruption_one_to_one",
    "span_corruption_rule",
    "split_tokens",
    "tokenize",
    "trim",
    "trim_lengths",
]
