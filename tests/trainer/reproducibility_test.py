"""One run interrupted both ways, in child processes with hard timeouts, against a straight run:
SIGTERM finishes the step, saves and exits 0 (a second run on the model_dir meanwhile is
refused); a new process restores it and is SIGKILLed at a random moment during a checkpoint
save; a third process resumes to the end. Every step's loss and the final params equal the
straight 20 steps bit for bit.

The straight run trains in this process (the same trainer as train_worker.py's, imported from
it); its compiled programs land in the target's JAX compilation cache, which the children load.
"""

import collections
import json
import random
import re
import signal
import time

import numpy as np
import pytest
import train_worker
from mesh_util import make_partitioner
from subprocess_util import run_worker, wait_for_line, worker
from tiny_model import CountingIterator, TinyModel

from cairn.trainer import Checkpointer, OptimizerConfig, Trainer, TrainerConfig

STEPS = 20
TIMEOUT_S = 240  # each child's deadline (loaded 2-core machine; the programs come from the cache)
SIGTERM_STEP = 2  # the worker waits for SIGTERM while reading step 2's batch


def _losses(model_dir) -> dict:
    """step -> loss; every value a step was logged with (re-run steps log again) must agree."""
    seen = collections.defaultdict(set)
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if row["task"] == "train" and row["metric"] == "loss":
                seen[row["step"]].add(row["value"])
    disagree = {s: v for s, v in seen.items() if len(v) > 1}
    assert not disagree, f"a re-run step logged a different loss: {disagree}"
    return {s: v.pop() for s, v in sorted(seen.items())}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """20 steps without interruption (this process): its model_dir and final params."""
    d = tmp_path_factory.mktemp("straight")
    result = train_worker.trainer(d, STEPS).train(train_worker.Batches())
    assert result.step == STEPS and not result.preempted
    return d, train_worker.flat_params(result.state.params)


@pytest.fixture(scope="module")
def preempted(straight, tmp_path_factory):
    """A worker told to train 20 steps gets SIGTERM while it reads step 2's batch; before that,
    while it holds the model_dir, this process tries a second run there. Returns the model_dir,
    the worker's pid, exit code and output, and what the second run raised."""
    run_dir = tmp_path_factory.mktemp("chain") / "run"
    with worker(run_dir, STEPS, "--checkpoint_every", 0, "--wait_for_sigterm") as proc:
        wait_for_line(proc, "READY", timeout=TIMEOUT_S)
        cfg = TrainerConfig(model_dir=str(run_dir), num_train_steps=2, tensorboard=False)
        second = Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(8, 1), cfg)
        try:
            second.train(CountingIterator())
            refused = None
        except Exception as e:  # checked by test_second_run_on_the_same_model_dir_is_refused
            refused = e
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    return run_dir, proc.pid, proc.returncode, out, refused


def test_sigterm_finishes_the_step_saves_and_exits_0(preempted):
    run_dir, _, returncode, out, _ = preempted
    assert returncode == 0, out[-3000:]
    # The step whose batch was being read when SIGTERM came is finished, then saved; no more.
    assert f"DONE step={SIGTERM_STEP} preempted=True" in out, out[-3000:]
    ckpt = Checkpointer(run_dir)
    try:
        assert ckpt.latest_step() == SIGTERM_STEP
    finally:
        ckpt.close()
    assert not (run_dir / "cairn.lock").exists()


def test_second_run_on_the_same_model_dir_is_refused(preempted):
    _, pid, _, _, refused = preempted
    assert refused is not None, "a second run on a model_dir in use was not refused"
    assert re.search(f"in use by pid {pid}", str(refused)), refused


@pytest.mark.parametrize("seed", [0])
def test_restore_then_sigkill_during_a_save_then_resume_is_bit_identical(straight, preempted, seed):
    """The preempted run (step 2) is restored by a new process that saves every step and is
    SIGKILLed during one of those saves; a third process resumes from the last good checkpoint."""
    rng = random.Random(seed)
    run_dir = preempted[0]
    ckpt_dir = run_dir / "checkpoints"
    with worker(run_dir, STEPS, "--checkpoint_every", 1, "--sleep", 0.03) as proc:
        wait_for_line(proc, "READY", timeout=TIMEOUT_S)
        saves_to_skip = rng.randrange(0, 4)
        deadline, seen = time.monotonic() + 60, set()
        while time.monotonic() < deadline and proc.poll() is None:
            tmp = {p.name for p in ckpt_dir.glob("*tmp*")} if ckpt_dir.exists() else set()
            new = tmp - seen
            seen |= tmp
            if new and len(seen) > saves_to_skip:
                time.sleep(rng.uniform(0.0, 0.03))
                proc.kill()
                break
            time.sleep(0.002)
        killed_during_run = proc.poll() is None or proc.wait(timeout=30) == -9
    assert killed_during_run, "the worker finished before a save could be interrupted"
    out = run_dir.parent / "params.npz"
    resumed = run_worker(run_dir, STEPS, "--out", out, timeout=TIMEOUT_S)
    assert f"DONE step={STEPS}" in resumed

    straight_dir, straight_params = straight
    got, want = _losses(run_dir), _losses(straight_dir)
    assert list(want) == list(range(1, STEPS + 1)) and got == want
    with np.load(out) as z:
        params = {k: z[k] for k in z.files}
    assert params.keys() == straight_params.keys()
    for k in params:
        assert np.array_equal(params[k], straight_params[k]), f"params {k} differ"
