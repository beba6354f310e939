"""Metrics are never lost: every trained step's row reaches metrics.jsonl whichever way the loop
ends (SIGTERM between logs, an error in a hook, a peer watchdog ending the process; a NaN loss:
faults_test), every row up to a checkpoint is written before the checkpoint is saved, and step
hooks may take the step's metrics."""

import json
import os
import signal

import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn.partitioning import peer_watchdog
from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig


def losses(model_dir):
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["value"] for r in rows if r["task"] == "train" and r["metric"] == "loss"}


def trainer(tmp_path, hooks=(), checkpoint_every=0):
    cfg = TrainerConfig(
        model_dir=str(tmp_path),
        num_train_steps=20,
        log_every=100,
        checkpoint_every=checkpoint_every,
        tensorboard=False,
    )
    # The 4 x 2 set-up of the group's other modules: its programs come from the compilation cache.
    return Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg, step_hooks=hooks)


def test_sigterm_between_logs_keeps_every_step(tmp_path):
    def hook(step, state):
        if step == 7:  # after this step's log check: the stop comes from the flag polled after the hooks
            os.kill(os.getpid(), signal.SIGTERM)

    result = trainer(tmp_path, (hook,)).train(CountingIterator())
    assert result.preempted and result.step == 7
    assert sorted(losses(tmp_path)) == list(range(1, 8))


def test_an_error_in_a_hook_keeps_the_steps_trained(tmp_path):
    def hook(step, state):
        if step == 5:
            raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        trainer(tmp_path, (hook,)).train(CountingIterator())
    assert sorted(losses(tmp_path)) == list(range(1, 6))


def test_step_hooks_taking_three_arguments_get_the_steps_metrics(tmp_path):
    seen, plain = {}, []

    def with_metrics(step, state, metrics):
        seen[step] = (metrics["loss"], sorted(metrics))

    result = trainer(tmp_path, (with_metrics, lambda step, state: plain.append(step))).train(CountingIterator())
    assert result.step == 20 and plain == list(range(1, 21))
    logged = losses(tmp_path)
    assert {step: loss for step, (loss, _) in seen.items()} == logged
    assert {"grad_norm", "learning_rate", "loss"} <= set(seen[1][1])


def test_rows_are_written_with_each_checkpoint_and_by_a_watchdog_ending_the_process(tmp_path):
    """With no log step before 20, the rows up to each checkpoint (every 3 steps) are in the file
    before the checkpoint is saved: a kill after it commits loses no row its resume won't retrain.
    At step 11 the peer watchdog's stop hooks run (as when it ends the process for a lost peer):
    the steps whose metrics are computed are written."""
    seen = {}

    def hook(step, state):
        seen[step] = sorted(losses(tmp_path)) if (tmp_path / "summaries" / "metrics.jsonl").exists() else []
        if step == 11:
            peer_watchdog.run_stop_hooks()
            seen["stopped"] = sorted(losses(tmp_path))

    result = trainer(tmp_path, (hook,), checkpoint_every=3).train(CountingIterator())
    assert result.step == 20
    assert seen[4] == [1, 2, 3] and seen[7] == list(range(1, 7)) and seen[10] == list(range(1, 10))
    # steps 1-10 at least (step 11's too if its computation has finished: never waited for)
    assert seen["stopped"] in (list(range(1, 11)), list(range(1, 12))), str(seen["stopped"])
    assert sorted(losses(tmp_path)) == list(range(1, 21))  # each once (losses() keeps the last)
    rows = (tmp_path / "summaries" / "metrics.jsonl").read_text().splitlines()
    assert sum('"metric": "loss"' in r for r in rows) == 20
