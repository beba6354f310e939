"""`//launchers:infer`: predictions of a checkpoint as JSON lines, written in chunks, resumable.

    bazel run //launchers:infer -- --config=launchers/configs/shakespeare_t5_tiny.py \
        --output=preds.jsonl [--checkpoint=DIR] [--step=N] [--chunk_size=64] \
        [--num_examples=N] [--input_file=prompts.txt]

Models conditioned on an input feature (the family's `input_feature`: encoder-decoder) predict
the targets of the config's evaluation task (`eval.task`, default `data.task`; split
`eval.split`; `--num_examples`, default `eval.num_examples`, 0 for all). Models that continue a
prompt (`continues_prompt`: decoder-only) continue the lines of `--input_file`, or else the
first half of each evaluation example's tokens. Decoding follows `post_training.decode_method` etc.

Chunk `k` (examples `[k * chunk_size, (k + 1) * chunk_size)`) is written atomically to
`<output>.parts/part-<k>.jsonl`; a rerun skips the chunks on disk, so an interrupted job
resumes. `<output>.parts/meta.json` records what the parts are predictions of (checkpoint
step, examples, chunk size, config hash); a rerun that differs is refused rather than mixed
(`--overwrite` starts again). When every chunk exists they are joined into `<output>`.
Rows: `{"index", "input", "target", "prediction", "prediction_ids"}` (decoded with the
config's vocabulary).

A chunk is decoded as one global batch of `chunk_size` rows (the last one padded with masked
rows), so `chunk_size` must divide over the hosts' data shards (any size on one process; the
batch is padded to a multiple of the data-parallel devices). On several processes
(started like the train entry point) every process decodes only its rows of each chunk, the
predictions are gathered in input order, process 0 decides which chunks are missing (all
processes decode those) and alone writes the parts, `meta.json` and `<output>`.
"""

from __future__ import annotations

import cairn.launchers.startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from absl import flags

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.launchers import builder, checkpoint_params, cli, config_io, eval_setup
from cairn.launchers import data as data_lib
from cairn.launchers.config_base import model_family
from cairn.launchers.fingerprint import config_hash
from cairn.launchers.post_training import pad_rows
from cairn.launchers.sharded_batches import ShardedBatches, check_batch_size
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)

OUTPUT = flags.DEFINE_string("output", "", "the JSON-lines file to write (required)")
CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "", "model_dir, checkpoints folder or step folder (default: config.model_dir)"
)
STEP = flags.DEFINE_integer("step", None, "this step's checkpoint (default: the latest complete one)")
CHUNK = flags.DEFINE_integer("chunk_size", 64, "examples per written chunk")
NUM = flags.DEFINE_integer("num_examples", None, "examples to predict (default eval.num_examples; 0: all)")
INPUT_FILE = flags.DEFINE_string("input_file", "", "decoder-only: prompts, one per line")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "discard existing parts and start again")


def inputs(config: ml_collections.ConfigDict, vocabulary: Any, num_examples: int | None, input_file: str) -> list[dict]:
    """`[{"ids", "input", "target"}]`: what each prediction starts from, in order."""
    family = model_family(config.model.kind)
    if family.continues_prompt and input_file:
        prompts = [line.rstrip("\r") for line in storage.read_text(input_file).split("\n") if line.strip()]
        return [{"ids": vocabulary.encode(p), "input": p, "target": ""} for p in prompts]
    n = config.eval.num_examples if num_examples is None else num_examples
    cfg = ml_collections.ConfigDict(config.to_dict())
    cfg.eval.num_examples = n
    evaluator = builder.make_evaluator(cfg)
    task = sorted(evaluator.task_names)[0]
    rows = []
    for ex in evaluator.examples(task):
        if family.continues_prompt:
            ids = [int(t) for t in ex["targets"]]
            ids, rest = ids[: len(ids) // 2], ids[len(ids) // 2 :]
            rows.append({"ids": ids, "input": vocabulary.decode(ids), "target": vocabulary.decode(rest)})
        else:
            ids = [int(t) for t in ex[family.input_feature]]
            rows.append(
                {
                    "ids": ids,
                    "input": vocabulary.decode(ids),
                    "target": vocabulary.decode([int(t) for t in ex["targets"]]),
                }
            )
    return rows


def make_decoder(
    config: ml_collections.ConfigDict, model: Any, partitioner: Any, prompt_length: int, batch_size: int
) -> Callable:
    """`decode(params, ids [n, prompt_length], first_index, total) -> tokens [n, length]` with the
    config's decoding options, in sharded global batches of `batch_size` rows (`ShardedBatches`)."""
    from cairn.models import DecodeOptions

    pt = config.post_training
    family = model_family(config.model.kind)
    new = pt.max_decode_length or data_lib.sequence_length(config)["targets"]
    length = new + (prompt_length if family.continues_prompt else 0)
    options = DecodeOptions(
        method=pt.decode_method, max_decode_length=length, temperature=pt.temperature, top_k=pt.top_k
    )

    def fn(p, x):
        rng = jax.random.PRNGKey(config.seed)
        return model.predict_batch(p, family.decode_batch(x), options, rng=rng)[0]

    return ShardedBatches(partitioner, fn, batch_size, "decodes")


def _plan(parts: str, meta: dict, chunks: int, overwrite: bool) -> list[int]:
    """(process 0) Checks and writes `meta.json`; returns the chunks whose part is missing."""
    meta_path = storage.join(parts, "meta.json")
    if overwrite:
        storage.remove_tree(parts)
    present = storage.sizes(parts)
    if "meta.json" in present:
        old = storage.read_json(meta_path)
        if old != meta:
            diff = sorted(k for k in meta if old.get(k) != meta[k])
            raise ConfigError(
                "output",
                f"{parts} holds parts of other predictions (differs in {diff}); use another --output or --overwrite",
            )
    storage.write_json(meta_path, meta)
    return [k for k in range(chunks) if f"part-{k:05d}.jsonl" not in present]


def infer(
    config: ml_collections.ConfigDict,
    output: str,
    path: str,
    step: int | None = None,
    chunk_size: int = 64,
    num_examples: int | None = None,
    input_file: str = "",
    overwrite: bool = False,
    out: Callable[[str], None] = print,
) -> str:
    """Writes the predictions to `output` (resuming from its parts); returns the path. Every
    process of the job calls it; process 0 writes the files."""

    if not output:
        raise ConfigError("output", "--output=path/to/predictions.jsonl is required")
    if chunk_size < 1:
        raise ConfigError("chunk_size", f"must be >= 1, got {chunk_size}")
    try:
        storage.check_writable(os.fspath(storage.path(output).parent) or ".")
    except storage.StorageError as e:
        raise ConfigError("output", str(e)) from None
    family = model_family(config.model.kind)
    ready = eval_setup.prepare(config, eval_task=not (family.continues_prompt and input_file))
    partitioner = ready["partitioner"]
    check_batch_size("chunk_size", chunk_size, partitioner)
    vocabulary = ready["vocabulary"]
    model = builder.load_model(config, vocabulary, net=ready["model_config"])
    step, params = checkpoint_params.load_params(config, model, partitioner, path, step)
    rows = inputs(config, vocabulary, num_examples, input_file)
    parts = output + ".parts"
    meta = {
        "checkpoint": storage.absolute(path),
        "step": step,
        "num_examples": len(rows),
        "chunk_size": chunk_size,
        "config_hash": config_hash(config_io.hashable_config(config)),
        "input_file": storage.absolute(input_file) if input_file else "",
    }
    chunks = range(0, len(rows), chunk_size)
    missing = eval_setup.from_process_0(lambda: _plan(parts, meta, len(chunks), overwrite))
    lengths = data_lib.sequence_length(config)
    prompt_length = (
        max([len(r["ids"]) for r in rows] + [1]) if family.continues_prompt else lengths[family.input_feature]
    )
    decode = make_decoder(config, model, partitioner, prompt_length, chunk_size)
    for k in missing:
        start = chunks[k]
        chunk = rows[start : start + chunk_size]
        tokens = decode(params, pad_rows([r["ids"] for r in chunk], prompt_length), start, len(rows))
        if not eval_setup.is_process_0():
            continue
        lines = []
        for i, (r, t) in enumerate(zip(chunk, tokens)):
            pred = [int(x) for x in t]
            if family.continues_prompt:  # the output starts with the prompt
                pred = pred[len(r["ids"]) :]
            end = pred.index(0) if 0 in pred else len(pred)
            lines.append(
                json.dumps(
                    {
                        "index": start + i,
                        "input": r["input"],
                        "target": r["target"],
                        "prediction": vocabulary.decode(pred[:end]),
                        "prediction_ids": pred[:end],
                    },
                    ensure_ascii=False,
                )
            )
        storage.write_text(storage.join(parts, f"part-{k:05d}.jsonl"), "".join(line + "\n" for line in lines))
        out(f"chunk {k + 1}/{len(chunks)} written ({start + len(chunk)}/{len(rows)} examples)")
    if eval_setup.is_process_0():
        text = "".join(storage.read_text(storage.join(parts, f"part-{k:05d}.jsonl")) for k in range(len(chunks)))
        storage.write_text(output, text)
    out(
        f"{len(rows)} predictions of step {step} in {output} ({len(missing)} chunks computed, "
        f"{len(chunks) - len(missing)} resumed)"
    )
    return output


def _main(config: ml_collections.ConfigDict) -> None:
    path = config_io.resolve_path(CHECKPOINT.value) if CHECKPOINT.value else config.model_dir
    infer(
        config,
        config_io.resolve_path(OUTPUT.value),
        path,
        STEP.value,
        CHUNK.value,
        NUM.value,
        config_io.resolve_path(INPUT_FILE.value),
        OVERWRITE.value,
        out=eval_setup.print_on_process_0,
    )


def run() -> None:
    """The program; bad data, a missing checkpoint or unusable storage exit 2 (one line)."""
    from cairn.trainer import NoCheckpointError

    cli.run_entry_point(_main, expected=(DataTasksError, NoCheckpointError, storage.StorageError))


if __name__ == "__main__":
    run()
