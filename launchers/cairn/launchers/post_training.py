"""What a run does after training: the final evaluation (printed, and written at the last step
to metrics.jsonl, TensorBoard and any other writer) and sample outputs; then the run's summary
and the commands to run next (`summary`).

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
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from cairn import storage
from cairn.launchers import builder, predict_fns, schema
from cairn.launchers.config_base import model_family
from cairn.launchers.prompt_limit import PromptLimit
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.sharded_batches import ShardedBatches
from cairn.models.families import SAMPLES_EVAL_PREDICTIONS, SAMPLES_PROMPT_CONTINUATIONS

log = logging.getLogger(__name__)
Printer = Callable[[str], None]
Recorder = Callable[[str, int, Mapping[str, float]], None]  # SummaryWriter.scalars(task, step, values)


def pad_rows(rows: list, length: int) -> np.ndarray:
    """Token rows as a zero-padded `[len(rows), length]` int32 array (each row cut to `length`)."""
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = list(r)[:length]
        out[i, : len(r)] = r
    return out


def final_evaluation(
    spec: RunSpec,
    model: Any,
    params: Any,
    evaluator: Any,
    step: int,
    partitioner: Any,
    out: Printer = print,
    record: Recorder | None = None,
) -> dict:
    """Score metrics (e.g. perplexity) of the evaluation task at the end of training, and its
    prediction metrics with `eval.decode_metrics`; `record` (e.g. the run's
    `SummaryWriter.scalars`) gets them as task `eval`, `<task>/<metric>` at `step`, like the
    loop's evaluations."""
    batch, decode = spec.keys.eval.batch_size, spec.keys.eval.decode_metrics
    evaluate = builder.params_evaluation(spec, model, partitioner, evaluator, batch, decode, logging.DEBUG)
    result = evaluate(params, step)
    if record is not None and result.metrics:
        flat = {f"{t}/{k}": float(v) for t, metrics in result.metrics.items() for k, v in metrics.items()}
        record("eval", step, flat)
    for task, metrics in sorted(result.metrics.items()):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        out(f"final evaluation at step {step}: {task} ({spec.keys.eval.split}): {shown}")
    for task, errors in result.errors.items():
        out(f"final evaluation of {task}: {'; '.join(errors)}")
    return result.metrics


def _decode(
    spec: RunSpec, model: Any, params: Any, partitioner: Any, rows: np.ndarray, new: int, width: int = 0
) -> np.ndarray:
    """Decoded tokens of every row of `rows` (the model family's `decode_batch` of them), at
    most `new` each (`width`: a decoder-only model's prompt columns, `predict_fns.decode_options`),
    one sharded batch on the partitioner's mesh."""
    options = predict_fns.decode_options(spec, new, width)
    decode_batch = model_family(spec.keys.model.kind).decode_batch

    def fn(p, x):
        batch = decode_batch(x)
        out = model.predict_batch(p, batch, options, rng=jax.random.PRNGKey(spec.keys.seed))
        return predict_fns.best_decodes(*out, options)[0]

    return ShardedBatches(partitioner, fn, len(rows), "decodes", logging.DEBUG)(params, rows)


def denoising_samples(
    spec: RunSpec,
    model: Any,
    params: Any,
    evaluator: Any,
    partitioner: Any,
    out: Printer = print,
) -> list[dict]:
    """Prints `num_samples` evaluation examples with the model's decoded prediction."""
    n = spec.keys.post_training.num_samples
    if not n:
        return []
    lengths = spec.reader.sequence_length
    task = evaluator.task_names[0]  # the first task of a mixture
    examples, vocabulary = evaluator.examples(task)[:n], spec.vocabulary
    enc = pad_rows([ex["inputs"] for ex in examples], lengths["inputs"])
    length = spec.keys.post_training.max_decode_length or lengths["targets"]
    tokens = _decode(spec, model, params, partitioner, enc, length)
    samples = []
    for i, (ex, pred) in enumerate(zip(examples, tokens)):
        sample = {
            "input": vocabulary.decode(list(map(int, ex["inputs"]))),
            "target": vocabulary.decode(list(map(int, ex["targets"]))),
            "prediction": vocabulary.decode([int(t) for t in pred]),
        }
        samples.append(sample)
        out(
            f"sample {i}: input:      {sample['input']}\n          target:     {sample['target']}\n"
            f"          prediction: {sample['prediction']}"
        )
    return samples


def generate_text(
    spec: RunSpec,
    model: Any,
    params: Any,
    partitioner: Any,
    out: Printer = print,
) -> list[str]:
    """Continues each of `post_training.prompts` (decoder-only models; each within
    `post_training.max_input_length`, `prompt_limit`); prints and returns prompt + continuation."""
    prompts, vocabulary = list(spec.keys.post_training.prompts), spec.vocabulary
    if not prompts:
        return []
    encoded = PromptLimit.of(spec).fit([vocabulary.encode(p) for p in prompts])
    longest = max(len(e) for e in encoded)
    new = spec.keys.post_training.max_decode_length or spec.reader.sequence_length["targets"]
    width = max(longest, 1)
    tokens = _decode(spec, model, params, partitioner, pad_rows(encoded, width), new, width)
    texts = []
    for i, (_prompt, row) in enumerate(zip(prompts, tokens)):
        text = vocabulary.decode([int(t) for t in row])
        texts.append(text)
        out(f"generated {i}: {text}")
    return texts


def run(
    spec: RunSpec,
    model: Any,
    params: Any,
    evaluator: Any,
    step: int,
    partitioner: Any,
    out: Printer = print,
    record: Recorder | None = None,
) -> dict:
    """The spec's post-training actions on the run's `partitioner`; returns what they produced.
    `record`: where the final evaluation's metrics are written (see `final_evaluation`). The
    samples are printed first, the final evaluation last (next to the summary)."""
    result: dict = {}
    held: list[str] = []
    if spec.keys.post_training.final_eval and evaluator is not None:
        result["metrics"] = final_evaluation(spec, model, params, evaluator, step, partitioner, held.append, record)
    samples = model_family(spec.keys.model.kind).samples
    if samples == SAMPLES_EVAL_PREDICTIONS and evaluator is not None:
        result["samples"] = denoising_samples(spec, model, params, evaluator, partitioner, out)
    if samples == SAMPLES_PROMPT_CONTINUATIONS:
        result["generated"] = generate_text(spec, model, params, partitioner, out)
    for line in held:
        out(line)
    return result


def _command(program: str, args: Sequence[str]) -> str:
    """How the user runs `program` (`eval`, `infer`, `export`, `plot_loss`): `./bazelw run
    //launchers:X --` under `bazel run`, else `python -m cairn.launchers.<module>`."""
    module = {"eval": "eval_main", "infer": "infer_main", "export": "export", "plot_loss": "plot_loss"}[program]
    head = (
        f"./bazelw run //launchers:{program} --"
        if os.environ.get("BUILD_WORKSPACE_DIRECTORY")
        else (f"python -m cairn.launchers.{module}")
    )
    return " ".join([head, *(shlex.quote(a) for a in args)])


def config_args(argv: Sequence[str], model_dir: str) -> list[str]:
    """The `--config=...` and `--config.*` flags of `argv` (this run's experiment and overrides),
    with `--config.model_dir` set to `model_dir`."""
    out, i = [], 1
    while i < len(argv):
        a = argv[i]
        if a in ("--config", "--config.model_dir") and i + 1 < len(argv):
            if a == "--config":
                out.append(f"--config={argv[i + 1]}")
            i += 2
            continue
        if a.startswith("--config=") or (a.startswith("--config.") and not a.startswith("--config.model_dir=")):
            out.append(a)
        i += 1
    return [*out, f"--config.model_dir={model_dir}"]


def next_commands(config: schema.Config, argv: Sequence[str] | None = None) -> list[str]:
    """`name: command` lines of what to run next on this run (evaluate, predict, export a
    SavedModel, the notebook handle, the loss curve, TensorBoard, W&B sync), with its paths;
    `argv`: the train command line (default `sys.argv`)."""

    model_dir = config.model_dir
    args = config_args(sys.argv if argv is None else argv, model_dir)
    png = storage.join(model_dir, "loss.png")
    lines = [
        f"evaluate:     {_command('eval', args)}",
        f"predict:      {_command('infer', [*args, '--output=' + storage.join(model_dir, 'predictions.jsonl')])}",
        f"export:       {_command('export', [*args, '--output=' + storage.join(model_dir, 'saved_model')])}",
        f"notebook:     from cairn.launchers.interactive import InteractiveModel; "
        f"model = InteractiveModel.from_run({model_dir!r})",
        f"loss curve:   {_command('plot_loss', ['--model_dir=' + model_dir, '--output=' + png])}",
    ]
    if config.trainer.tensorboard:
        lines.append(f"TensorBoard:  tensorboard --logdir {shlex.quote(storage.join(model_dir, 'tensorboard'))}")
    if config.logging.wandb and not storage.is_url(model_dir):
        lines.append(f"W&B upload:   wandb sync {shlex.quote(os.path.join(model_dir, 'wandb'))}/offline-run-*")
    return lines


def _duration(seconds: float) -> str:
    from cairn.trainer.console import duration

    return duration(seconds)


def summary(
    config: schema.Config,
    result: Any,
    train_s: float,
    total_s: float,
    out: Printer = print,
    argv: Sequence[str] | None = None,
) -> list[str]:
    """Prints (and returns) the end of a run, after the final evaluation's line: steps, final
    loss, wall times (training; all), where everything is, and the commands to run next."""

    model_dir = config.model_dir
    stopped = " (preempted: checkpoint saved)" if result.preempted else ""
    if "loss" not in result.metrics and not result.preempted:  # nothing left to train: no `loss nan`
        lines = [f"already at step {result.step} of {config.num_train_steps}: nothing to train"]
    else:
        loss = f"; loss {result.metrics['loss']:.4f}" if "loss" in result.metrics else ""
        lines = [f"trained to step {result.step} in {_duration(train_s)} (total {_duration(total_s)}){stopped}{loss}"]
    lines += [
        f"model_dir: {model_dir}",
        f"  checkpoints:  {storage.join(model_dir, 'checkpoints')}",
        f"  metrics:      {storage.join(model_dir, 'summaries', 'metrics.jsonl')}",
    ]
    if config.trainer.tensorboard:
        lines.append(f"  TensorBoard:  {storage.join(model_dir, 'tensorboard')}")
    lines.append("next:")
    if result.preempted:
        lines.append("  resume:       the same command (it continues from the saved step)")
    lines += ["  " + line for line in next_commands(config, argv)]
    for line in lines:
        out(line)
    return lines
