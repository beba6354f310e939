"""`//launchers:eval`: evaluate one checkpoint, or every new checkpoint of a run as it appears.

    bazel run //launchers:eval -- --config=launchers/configs/shakespeare_t5_tiny.py \
        [--checkpoint=DIR] [--step=N] [--watch] [--decode]

`--checkpoint` is a model_dir, its `checkpoints/` folder or one step's folder (default: the
config's `model_dir`). Without `--watch` the latest complete checkpoint (or `--step`) is
evaluated once. With `--watch` every complete checkpoint is evaluated in step order, then the
directory is polled every `--poll_seconds` for new ones; steps already evaluated (recorded in
`<eval_dir>/evaluated.jsonl`) are skipped, so a restarted watcher resumes where it stopped. It
stops after evaluating step `num_train_steps`, or after `--idle_timeout_seconds` without a
new checkpoint. Results: `<model_dir>/eval/<split>/` (`evaluated.jsonl`, the Evaluator's
`metrics.jsonl` and example files, TensorBoard event files). Score metrics always run;
`--decode` also decodes predictions for the tasks' prediction metrics (BLEU, accuracy, ...):
an encoder-decoder model decodes each example's `inputs`; a decoder-only model continues a
prompt, the task's `inputs` or else the first half of its `targets`, and the continuation (the
prompt removed) is compared with the `targets`, or their second half (`decode_views`). Exit
status 2 on a bad config.

On several processes (started like the train entry point, `multihost.*` or `$CAIRN_*`) every
process decodes and scores only its rows of each global batch of `eval.batch_size` rows (which
must divide over the hosts' data shards; any size on one process), the outputs are gathered in
input order, and process 0 alone writes the files and prints; process 0 also chooses the steps
to evaluate. `data.batch_size` is not checked.
"""

from __future__ import annotations

import cairn.launchers.quiet_startup  # noqa: F401  # isort: skip  (first: silences TF/CUDA/absl start-up noise)

import logging
import time
from collections.abc import Callable

from absl import flags

from cairn import storage
from cairn.datatasks import DataTasksError
from cairn.evaluation import JsonLinesLogger, TensorBoardLogger
from cairn.launchers import builder, checkpoint_flags, checkpoint_params, cli, config_io, entry, run_setup
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError

log = logging.getLogger(__name__)

WATCH = flags.DEFINE_bool("watch", False, "evaluate every new checkpoint as it appears")
DECODE = flags.DEFINE_bool("decode", False, "also decode predictions (prediction metrics)")
POLL = flags.DEFINE_float("poll_seconds", 10.0, "--watch: seconds between looks for new checkpoints")
IDLE = flags.DEFINE_float("idle_timeout_seconds", 3600.0, "--watch: stop after this long without a new checkpoint")
EVAL_DIR = flags.DEFINE_string("eval_dir", "", "where results go (default: <model_dir>/eval/<split>)")


class EvaluatedLog:
    """`evaluated.jsonl`: one row `{step, metrics}` per evaluated checkpoint (appended and fsynced
    locally; one whole part object per row at a URL)."""

    def __init__(self, eval_dir: str):
        self.path = storage.join(eval_dir, "evaluated.jsonl")
        self._writer: storage.JsonLinesWriter | None = None

    def steps(self) -> set[int]:
        done = set()
        for row in storage.read_json_lines(self.path)[0]:
            try:
                done.add(int(row["step"]))
            except (ValueError, KeyError, TypeError):
                continue
        return done

    def add(self, step: int, metrics: dict) -> None:
        if self._writer is None:
            self._writer = storage.JsonLinesWriter(self.path, fsync=True)
        self._writer.append([{"step": step, "metrics": metrics}], flush=True)


def make_runner(
    spec: RunSpec, eval_dir: str, decode: bool, out: Callable[[str], None] = print
) -> Callable[[str, int | None], tuple]:
    """`run(path, step) -> (step, metrics)`: restores one checkpoint's params and evaluates them
    (on every process; only process 0 writes the Evaluator's files)."""

    batch = spec.keys.eval.batch_size
    partitioner = run_setup.prepare(spec, train=False, padded=(("eval.batch_size", batch),), eval_task=True).partitioner
    model = builder.load_model(spec)
    loggers = (
        (JsonLinesLogger(eval_dir), TensorBoardLogger(storage.join(eval_dir, "tensorboard")))
        if run_setup.is_process_0()
        else ()
    )
    evaluator = builder.make_evaluator(spec, loggers=loggers, decode=decode)
    layout = checkpoint_params.params_layout(spec, model, partitioner)
    evaluate = builder.params_evaluation(spec, model, partitioner, evaluator, batch, decode)

    def run(path: str, step: int | None) -> tuple:
        step, params = checkpoint_params.load_params(layout, path, step)
        result = evaluate(params, step)
        for task, errors in result.errors.items():
            out(f"step {step}: {task}: {'; '.join(errors)}")
        return step, {t: {k: float(v) for k, v in m.items()} for t, m in result.metrics.items()}

    return run


def evaluate(
    spec: RunSpec,
    path: str,
    step: int | None = None,
    watch: bool = False,
    decode: bool = False,
    eval_dir: str = "",
    poll_seconds: float = 10.0,
    idle_timeout_seconds: float = 3600.0,
    out: Callable[[str], None] = print,
) -> dict[int, dict]:
    """Evaluates checkpoints under `path`; returns `{step: {task: {metric: value}}}` of this call.
    Every process of the job calls it; process 0 writes `evaluated.jsonl` and decides, with
    `--watch`, which steps to evaluate and when to stop."""
    eval_dir = eval_dir or storage.join(spec.keys.model_dir, "eval", spec.keys.eval.split)
    try:
        storage.check_writable(eval_dir)
    except storage.StorageError as e:
        raise ConfigError("eval_dir", str(e)) from None
    if (
        not watch
        and not checkpoint_params.complete_steps(path)
        and not storage.path(storage.join(path, "state")).is_dir()
    ):
        raise ConfigError("checkpoint", f"no complete checkpoint under {path!r}")
    run = make_runner(spec, eval_dir, decode, out)
    done_log = EvaluatedLog(eval_dir)
    results: dict[int, dict] = {}

    def one(p: str, s: int | None) -> int:
        s, metrics = run(p, s)
        if run_setup.is_process_0():
            done_log.add(s, metrics)
        results[s] = metrics
        shown = "; ".join(
            f"{t}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(m.items())) for t, m in sorted(metrics.items())
        )
        out(f"step {s}: {shown}")
        return s

    if not watch:
        one(path, step)
        return results
    idle_since = time.monotonic()

    def look() -> list[int]:
        """(process 0) `[stop, *new steps]`: stop when idle for too long."""
        done = done_log.steps()
        new = [s for s in checkpoint_params.complete_steps(path) if s not in done]
        return [int(not new and time.monotonic() - idle_since > idle_timeout_seconds)] + new

    while True:
        stop, *new = run_setup.from_process_0(look)
        for s in new:
            if one(path, s) >= spec.keys.num_train_steps:
                out(f"evaluated the final step {s}; stopping")
                return results
        if new:
            idle_since = time.monotonic()
        elif stop:
            out(f"no new checkpoint for {idle_timeout_seconds:.0f}s; stopping")
            return results
        time.sleep(poll_seconds)


def _main(spec: RunSpec) -> None:
    path = checkpoint_flags.checkpoint_path(spec)
    evaluate(
        spec,
        path,
        checkpoint_flags.STEP.value,
        WATCH.value,
        DECODE.value,
        config_io.resolve_path(EVAL_DIR.value),
        POLL.value,
        IDLE.value,
        out=run_setup.print_on_process_0,
    )


def run() -> None:
    """The program; bad data, a missing checkpoint or unusable storage exit 2 (one line)."""
    from cairn.trainer import NoCheckpointError

    cli.run_entry_point(_main, expected=(DataTasksError, NoCheckpointError, storage.StorageError))


if __name__ == "__main__":
    entry.main(run)
