"""Tasks with prediction metrics over the Shakespeare data, for the decoding tests
(`--config.data.task_modules="('cairn.launchers.tasks.shakespeare', 'decode_tasks')"`):

* `shakespeare_lm_decode`: the LM task (`targets` only) with perplexity, sequence accuracy and
  BLEU: decoded as a prompt (the first half) continued;
* `shakespeare_prefix_lm`: prefix-LM style, `inputs` = the first 6 tokens of the window and
  `targets` = the next 6, with sequence accuracy;
* `shakespeare_span_corruption_decode`: T5 denoising with perplexity and sequence accuracy;
* the mixture `shakespeare_decode_mix` of the first two.
"""

from __future__ import annotations

from typing import Any

import cairn.datatasks as dt
from cairn.evaluation import metrics
from cairn.launchers.tasks import shakespeare

LM = "shakespeare_lm_decode"
PREFIX_LM = "shakespeare_prefix_lm"
SPAN = "shakespeare_span_corruption_decode"
MIX = "shakespeare_decode_mix"
PREFIX = 6


def six_and_six(dataset: Any) -> Any:
    """A window of targets -> `inputs` = its first 6 tokens, `targets` = the next 6."""
    return dataset.map(lambda x: {"inputs": x["targets"][:PREFIX], "targets": x["targets"][PREFIX : 2 * PREFIX]})


def register_tasks(vocabulary: Any) -> None:
    registry = dt.DEFAULT_REGISTRY
    if MIX in registry:
        return
    shakespeare.register_tasks(vocabulary)
    lm = registry.get_task(shakespeare.LM)
    span = registry.get_task(shakespeare.SPAN_CORRUPTION)
    feature = lm.output_features["targets"]
    registry.add_task(
        dt.Task(
            LM,
            lm.source,
            lm.output_features,
            lm.preprocessors,
            metric_fns=[metrics.perplexity, metrics.sequence_accuracy, metrics.bleu],
        )
    )
    registry.add_task(
        dt.Task(
            PREFIX_LM,
            lm.source,
            {"inputs": feature, "targets": feature},
            (*lm.preprocessors, six_and_six),
            metric_fns=[metrics.sequence_accuracy],
        )
    )
    registry.add_task(
        dt.Task(
            SPAN,
            span.source,
            span.output_features,
            span.preprocessors,
            metric_fns=[metrics.perplexity, metrics.sequence_accuracy],
        )
    )
    registry.add_mixture(dt.Mixture(MIX, [LM, PREFIX_LM], default_rate=1.0))
