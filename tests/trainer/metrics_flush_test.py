"""Metrics are never lost: every trained step's row reaches metrics.jsonl whichever way the loop
ends (SIGTERM between logs, an error in a hook; a NaN loss: faults_test), and step hooks may
take the step's metrics."""

import json
import os
import signal

import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig


def losses(model_dir):
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["value"] for r in rows if r["task"] == "train" and r["metric"] == "loss"}


def trainer(tmp_path, hooks=()):
    cfg = TrainerConfig(
        model_dir=str(tmp_path), num_train_steps=20, log_every=100, checkpoint_every=0, tensorboard=False
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
