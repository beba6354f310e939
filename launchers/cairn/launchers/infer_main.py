"""`//launchers:infer`: predictions (or scores) of a checkpoint as JSON lines, written in
chunks, resumable.

    bazel run //launchers:infer -- --config=launchers/configs/shakespeare_t5_tiny.py \
        --output=preds.jsonl [--mode=predict|score|predict_with_aux] [--checkpoint=DIR] \
        [--step=N] [--chunk_size=64] [--num_examples=N] [--input_file=prompts.txt]

Every task of the config's evaluation task or mixture (`eval.task`, default `data.task`; split
`eval.split`; `--num_examples` per task, default `eval.num_examples`, 0 for all) gets its own
file, rows in input order: `--output` itself for one task, `<output without .jsonl>-<task>.jsonl`
for each task of a mixture. Encoder-decoder models are fed each example's `inputs`; decoder-only
models continue a prompt: the task's `inputs`, or else the first half of its `targets` (the
target is then the second half). The prediction excludes the prompt. `--input_file` replaces
the task (one file): a text file's lines are the inputs (no targets), a `.jsonl` file's lines
`{"input": ..., "target": ...}` inputs and targets (what `score` needs), tokenized as the
interactive handle tokenizes text (`example_rows`: an encoder-decoder's inputs and targets end
with EOS; a decoder-only prompt is continued as given). `--mode` (t5x's infer modes; `infer_rows`): `predict` (rows
`{index, input, target, prediction, prediction_ids}`), `score` (`{index, input, target,
score}`: the target's log-likelihood given the input, summed over its tokens) or
`predict_with_aux` (`predict`'s rows with `aux: {scores}`, the decoding's log-probability of
the prediction). Decoding follows `post_training.decode_method` etc.; a prediction has at most
`post_training.max_decode_length` tokens after its own prompt, whatever the other rows of its
chunk (default: the targets length; a decoder-only model's second half: its length), and a
prompt at most `post_training.max_input_length` (`prompt_limit`: a longer one is cut, with one
warning naming its rows, or refused: exit 2).

Chunk `k` of a file (its examples `[k * chunk_size, (k + 1) * chunk_size)`) is written
atomically to `<file>.parts/part-<k>.jsonl`; a rerun skips the chunks on disk, so an
interrupted job resumes. `<file>.parts/meta.json` records what the parts are (checkpoint step,
task, mode, examples, chunk size, config hash); a rerun that differs is refused rather than
mixed (`--overwrite` starts again). When every chunk exists they are joined into the file.

A chunk is decoded as one global batch of `chunk_size` rows (the last one padded with masked
rows), so `chunk_size` must divide over the hosts' data shards (any size on one process; the
batch is padded to a multiple of the data-parallel devices). On several processes
(started like the train entry point) every process decodes only its rows of each chunk, the
predictions are gathered in input order, process 0 decides which chunks are missing (all
processes decode those) and alone writes the parts, `meta.json` and the files.
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import logging
import os
from collections.abc import Callable
from typing import Any

from absl import flags

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.launchers import builder, checkpoint_flags, checkpoint_params, cli, config_io, entry, infer_rows, run_setup
from cairn.launchers.fingerprint import config_hash
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)

OUTPUT = flags.DEFINE_string("output", "", "the JSON-lines file to write (required)")
CHUNK = flags.DEFINE_integer("chunk_size", 64, "examples per written chunk")
NUM = flags.DEFINE_integer("num_examples", None, "examples to predict (default eval.num_examples; 0: all)")
INPUT_FILE = flags.DEFINE_string(
    "input_file", "", 'inputs, one per line (instead of the task); .jsonl: {"input": ..., "target": ...} lines'
)
OVERWRITE = flags.DEFINE_bool("overwrite", False, "discard existing parts and start again")
MODE = flags.DEFINE_string("mode", "predict", "predict, score (target log-likelihoods) or predict_with_aux")


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
    spec: RunSpec,
    output: str,
    path: str,
    step: int | None = None,
    chunk_size: int = 64,
    num_examples: int | None = None,
    input_file: str = "",
    overwrite: bool = False,
    out: Callable[[str], None] = print,
    mode: str = "predict",
) -> dict[str, str]:
    """Writes every task's rows to its file (resuming from its parts); returns `{task: file}`.
    Every process of the job calls it; process 0 writes the files."""

    if not output:
        raise ConfigError("output", "--output=path/to/predictions.jsonl is required")
    if chunk_size < 1:
        raise ConfigError("chunk_size", f"must be >= 1, got {chunk_size}")
    infer_rows.check_mode(mode, input_file)
    try:
        storage.check_writable(os.fspath(storage.path(output).parent) or ".")
    except storage.StorageError as e:
        raise ConfigError("output", str(e)) from None
    ready = run_setup.prepare(spec, train=False, padded=(("chunk_size", chunk_size),), eval_task=not input_file)
    partitioner = ready.partitioner
    rows = infer_rows.task_rows(spec, num_examples, input_file)
    infer_rows.check_targets(mode, rows)
    model = builder.load_model(spec)
    layout = checkpoint_params.params_layout(spec, model, partitioner)
    step, params = checkpoint_params.load_params(layout, path, step)
    tasks = infer_rows.task_objects(spec, rows)
    files = infer_rows.output_paths(output, sorted(rows))
    for task, file in files.items():
        meta = {
            "checkpoint": storage.absolute(path),
            "step": step,
            "task": task,
            "mode": mode,
            "num_examples": len(rows[task]),
            "chunk_size": chunk_size,
            "config_hash": config_hash(config_io.hashable_config(spec.stored)),
            "input_file": storage.absolute(input_file) if input_file else "",
        }
        new = infer_rows.new_tokens(spec, tasks[task])
        writer = infer_rows.ChunkWriter(spec, model, partitioner, chunk_size, mode, rows[task], new)
        _write_file(file, meta, rows[task], chunk_size, overwrite, params, writer, out)
    return files


def _write_file(
    file: str,
    meta: dict,
    rows: list[dict],
    chunk_size: int,
    overwrite: bool,
    params: Any,
    writer: infer_rows.ChunkWriter,
    out: Callable[[str], None],
) -> None:
    """One task's chunks: the missing ones computed and written (process 0), then joined."""
    parts = file + ".parts"
    chunks = range(0, len(rows), chunk_size)
    missing = run_setup.from_process_0(lambda: _plan(parts, meta, len(chunks), overwrite))
    for k in missing:
        start = chunks[k]
        chunk = rows[start : start + chunk_size]
        lines = writer.lines(params, chunk, start, len(rows))
        if not run_setup.is_process_0():
            continue
        storage.write_text(storage.join(parts, f"part-{k:05d}.jsonl"), "".join(line + "\n" for line in lines))
        out(f"{file}: chunk {k + 1}/{len(chunks)} written ({start + len(chunk)}/{len(rows)} examples)")
    if run_setup.is_process_0():
        text = "".join(storage.read_text(storage.join(parts, f"part-{k:05d}.jsonl")) for k in range(len(chunks)))
        storage.write_text(file, text)
    what = "scores" if meta["mode"] == "score" else "predictions"
    out(
        f"{len(rows)} {what} of step {meta['step']} in {file} ({len(missing)} chunks computed, "
        f"{len(chunks) - len(missing)} resumed)"
    )


def _main(spec: RunSpec) -> None:
    path = checkpoint_flags.checkpoint_path(spec)
    infer(
        spec,
        config_io.resolve_path(OUTPUT.value),
        path,
        checkpoint_flags.STEP.value,
        CHUNK.value,
        NUM.value,
        config_io.resolve_path(INPUT_FILE.value),
        OVERWRITE.value,
        out=run_setup.print_on_process_0,
        mode=MODE.value,
    )


def run() -> None:
    """The program; bad data, a missing checkpoint or unusable storage exit 2 (one line)."""
    from cairn.trainer import NoCheckpointError

    cli.run_entry_point(_main, expected=(DataTasksError, NoCheckpointError, storage.StorageError), logs=cli.quiet_logs)


if __name__ == "__main__":
    entry.main(run)
