"""What a decoder-only model is asked to continue, and what its continuation is compared with.

t5x's `DecoderOnlyModel.predict_batch` decodes prefix-LM features: the `inputs` part of the
sequence is the prompt, the model continues it, and the prompt is removed from the output, so
a prediction metric compares the continuation with `targets`. The decode view of a task follows
that rule:

* a task with an `inputs` feature (prefix-LM style): prompt = `inputs`, target = `targets`;
* a language-model task (`targets` only): its `targets` cut to `data.sequence_length.targets`
  are split in half, seqio-style by a last preprocessor (`split_prompt`): prompt = the first
  `n // 2` tokens, target = the other `n - n // 2` (any `*_pretokenized` text is dropped, so
  the metrics' target is the second half's text).

The view's model features are the family's (`LMFeatureConverter`) plus `inputs`, the prompt,
right-padded with 0; with `data.sequence_length.targets` = L a language-model view's targets
are padded to `L - L // 2`, the most new tokens its target can hold. Score metrics stay on the
tasks as they are (`lm_evaluator`), so perplexity does not depend on decoding.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import cairn.datatasks as dt
from cairn.datatasks.lazy_tf import tf
from cairn.evaluation.metric_objects import metric_kind

PROMPT = "inputs"  # the model feature holding each row's prompt


def has_prompt_feature(task: Any) -> bool:
    """Whether the task gives its own prompt (`inputs`: prefix-LM style)."""
    return PROMPT in task.output_features


def split_prompt(dataset: Any, sequence_length: Mapping[str, int] | None = None) -> Any:
    """`targets` (cut to `sequence_length["targets"]`) -> `inputs` = its first half, `targets`
    = the rest; `*_pretokenized` features are dropped (they would name the whole text)."""
    n = (sequence_length or {}).get("targets")

    def split(x):
        t = x["targets"][:n] if n else x["targets"]
        half = tf.size(t) // 2
        out = {k: v for k, v in x.items() if not k.endswith("_pretokenized")}
        out.update({PROMPT: t[:half], "targets": t[half:]})
        return out

    return dataset.map(split)


def with_metrics(task: Any, kinds: tuple[str, ...]) -> Any:
    """A copy of `task` (same name, not registered) keeping the metric functions of `kinds`."""
    view = copy.copy(task)
    view.metric_fns = tuple(fn for fn in task.metric_fns if metric_kind(fn) in kinds)
    view.metric_objs = tuple(m for m in getattr(task, "metric_objs", ()) if metric_kind(m) in kinds)
    return view


class ContinuationConverter(dt.LMFeatureConverter):
    """The family's `LMFeatureConverter(pack=False)` passing the prompt (`inputs`) through,
    with `targets` padded to at most `max_targets` (None: as given)."""

    def __init__(self, max_targets: int | None = None):
        super().__init__(pack=False, passthrough_features=(PROMPT,))
        self._max_targets = max_targets

    def __call__(self, ds: Any, task_feature_lengths: Mapping[str, int]) -> Any:
        lengths = dict(task_feature_lengths)
        if self._max_targets is not None and "targets" in lengths:
            lengths["targets"] = max(1, min(lengths["targets"], self._max_targets))
        return super().__call__(ds, lengths)


def decode_view(task: Any, targets_length: int, kinds: tuple[str, ...] = ("prediction",)) -> tuple[Any, Any]:
    """`(task view, feature converter)`: the task a decoder-only model is decoded on (see the
    module docstring), keeping the metric functions of `kinds`."""
    view = with_metrics(task, kinds)
    if has_prompt_feature(task):
        return view, ContinuationConverter()
    targets = task.output_features["targets"]
    view.output_features = {**task.output_features, PROMPT: dataclasses.replace(targets, add_eos=False)}
    view.preprocessors = (*task.preprocessors, split_prompt)
    return view, ContinuationConverter(targets_length - targets_length // 2)


def view_evaluator(
    task: Any,
    lengths: Mapping[str, int],
    split: str,
    num_examples: int | None,
    seed: int,
    kinds: tuple[str, ...] = ("prediction",),
    loggers: tuple = (),
) -> Any:
    """A `cairn.evaluation.Evaluator` over the decode view of one task; `lengths`: the config's
    `data.sequence_length` (`targets`; `inputs`, if given, cuts a prefix-LM task's prompts)."""
    from cairn.evaluation import Evaluator

    view, converter = decode_view(task, int(lengths["targets"]), kinds)
    keep = ("inputs", "targets") if has_prompt_feature(task) else ("targets",)
    return Evaluator(
        view,
        converter,
        split=split,
        num_examples=num_examples,
        seed=seed,
        sequence_length={k: int(lengths[k]) for k in keep if k in lengths},
        loggers=loggers,
    )
