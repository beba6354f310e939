"""What a run does after training: the final evaluation and sample outputs, printed.

The model family's `samples` (`cairn.models.families`) says which samples:

* `eval_predictions` (encoder-decoder): `post_training.num_samples` evaluation examples, each
  printed as the input (with its sentinels), the target and the model's prediction, decoded;
* `prompt_continuations` (decoder-only): each of `post_training.prompts` continued by the model.

Every process of a multi-process run calls these with the same params: batches are sharded
over the mesh (`ShardedBatches`, padded to a multiple of the data-parallel shards), so each
process computes its rows and all get every output; pass an `out` that prints on process 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from cairn.launchers import builder
from cairn.launchers import data as data_lib
from cairn.launchers.config_base import model_family
from cairn.launchers.sharded_batches import ShardedBatches

log = logging.getLogger(__name__)
Printer = Callable[[str], None]


def _decode_options(config: ml_collections.ConfigDict, length: int) -> Any:
    from cairn.models import DecodeOptions

    pt = config.post_training
    return DecodeOptions(method=pt.decode_method, max_decode_length=length, temperature=pt.temperature, top_k=pt.top_k)


def pad_rows(rows: list, length: int) -> np.ndarray:
    """Token rows as a zero-padded `[len(rows), length]` int32 array (each row cut to `length`)."""
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = list(r)[:length]
        out[i, : len(r)] = r
    return out


def _partitioner(config: ml_collections.ConfigDict, partitioner: Any) -> Any:
    return partitioner if partitioner is not None else builder.make_partitioner(config)


def final_evaluation(
    config: ml_collections.ConfigDict,
    model: Any,
    params: Any,
    evaluator: Any,
    step: int,
    out: Printer = print,
    partitioner: Any = None,
) -> dict:
    """Score metrics (e.g. perplexity) of the evaluation task at the end of training."""
    score = builder.score_fn_factory(
        model, config.eval.batch_size, partitioner=_partitioner(config, partitioner), log_level=logging.DEBUG
    )
    result = evaluator.evaluate(score_fn=score(params), step=step)
    for task, metrics in sorted(result.metrics.items()):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        out(f"final evaluation at step {step}: {task} ({config.eval.split}): {shown}")
    for task, errors in result.errors.items():
        out(f"final evaluation of {task}: {'; '.join(errors)}")
    return result.metrics


def _decode(
    config: ml_collections.ConfigDict, model: Any, params: Any, partitioner: Any, rows: np.ndarray, length: int
) -> np.ndarray:
    """Decoded tokens of every row of `rows` (the model family's `decode_batch` of them), one
    sharded batch on the partitioner's mesh."""
    options = _decode_options(config, length)
    decode_batch = model_family(config.model.kind).decode_batch

    def fn(p, x):
        batch = decode_batch(x)
        return model.predict_batch(p, batch, options, rng=jax.random.PRNGKey(config.seed))[0]

    return ShardedBatches(_partitioner(config, partitioner), fn, len(rows), "decodes", logging.DEBUG)(params, rows)


def denoising_samples(
    config: ml_collections.ConfigDict,
    model: Any,
    params: Any,
    evaluator: Any,
    vocabulary: Any,
    out: Printer = print,
    partitioner: Any = None,
) -> list[dict]:
    """Prints `num_samples` evaluation examples with the model's decoded prediction."""
    n = config.post_training.num_samples
    if not n:
        return []
    lengths = data_lib.sequence_length(config)
    task = evaluator.task_names[0]  # the first task of a mixture
    examples = evaluator.examples(task)[:n]
    enc = pad_rows([ex["inputs"] for ex in examples], lengths["inputs"])
    length = config.post_training.max_decode_length or lengths["targets"]
    tokens = _decode(config, model, params, partitioner, enc, length)
    samples = []
    for i, (ex, pred) in enumerate(zip(examples, tokens)):
        sample = {
            "input": vocabulary.decode(list(map(int, ex["inputs"]))),
            "target": vocabulary.decode(list(map(int, ex["targets"]))),
            "prediction": vocabulary.decode([int(t) for t in pred]),
        }
        samples.append(sample)
        out(
            f"sample {i}:\n  input:      {sample['input']}\n  target:     {sample['target']}\n"
            f"  prediction: {sample['prediction']}"
        )
    return samples


def generate_text(
    config: ml_collections.ConfigDict,
    model: Any,
    params: Any,
    vocabulary: Any,
    out: Printer = print,
    prompts: list[str] | None = None,
    partitioner: Any = None,
) -> list[str]:
    """Continues each prompt (decoder-only models); prints and returns prompt + continuation."""
    prompts = list(prompts if prompts is not None else config.post_training.prompts)
    if not prompts:
        return []
    encoded = [vocabulary.encode(p) for p in prompts]
    longest = max(len(e) for e in encoded)
    new = config.post_training.max_decode_length or data_lib.sequence_length(config)["targets"]
    tokens = _decode(config, model, params, partitioner, pad_rows(encoded, max(longest, 1)), longest + new)
    texts = []
    for i, (_prompt, row) in enumerate(zip(prompts, tokens)):
        text = vocabulary.decode([int(t) for t in row])
        texts.append(text)
        out(f"generated {i}: {text}")
    return texts


def run(
    config: ml_collections.ConfigDict,
    model: Any,
    params: Any,
    vocabulary: Any,
    evaluator: Any,
    step: int,
    out: Printer = print,
    partitioner: Any = None,
) -> dict:
    """The config's post-training actions; returns what they produced. `partitioner`: the run's
    (default: `builder.make_partitioner(config)`, the same mesh)."""
    from cairn.models.families import SAMPLES_EVAL_PREDICTIONS, SAMPLES_PROMPT_CONTINUATIONS

    partitioner = _partitioner(config, partitioner)
    result: dict = {}
    if config.post_training.final_eval and evaluator is not None:
        result["metrics"] = final_evaluation(config, model, params, evaluator, step, out, partitioner)
    samples = model_family(config.model.kind).samples
    if samples == SAMPLES_EVAL_PREDICTIONS and evaluator is not None:
        result["samples"] = denoising_samples(config, model, params, evaluator, vocabulary, out, partitioner)
    if samples == SAMPLES_PROMPT_CONTINUATIONS:
        result["generated"] = generate_text(config, model, params, vocabulary, out, partitioner=partitioner)
    return result
