"""20 steps straight == 10 steps + a new process restoring + 10 steps, bit for bit; also after a
SIGKILL at a random moment during a checkpoint save (subprocesses with hard timeouts)."""

import collections
import json
import random
import time

import numpy as np
import pytest
from subprocess_util import run_worker, wait_for_line, worker

STEPS = 20


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


def _params(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _assert_identical(a_dir, a_out, b_dir, b_out):
    la, lb = _losses(a_dir), _losses(b_dir)
    assert list(la) == list(range(1, STEPS + 1)) and la == lb
    pa, pb = _params(a_out), _params(b_out)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert np.array_equal(pa[k], pb[k]), f"params {k} differ"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    run_worker(d / "run", STEPS, "--out", d / "params.npz")
    return d / "run", d / "params.npz"


def test_ten_then_restore_then_ten_is_bit_identical(straight, tmp_path):
    out = tmp_path / "params.npz"
    first = run_worker(tmp_path / "run", 10)
    assert "DONE step=10" in first
    second = run_worker(tmp_path / "run", STEPS, "--out", out)
    assert "DONE step=20" in second
    _assert_identical(*straight, tmp_path / "run", out)


@pytest.mark.parametrize("seed", [0])
def test_sigkill_during_a_checkpoint_save_then_resume_is_bit_identical(straight, tmp_path, seed):
    rng = random.Random(seed)
    run_dir, out = tmp_path / "run", tmp_path / "params.npz"
    ckpt_dir = run_dir / "checkpoints"
    with worker(run_dir, STEPS, "--checkpoint_every", 1, "--sleep", 0.03) as proc:
        wait_for_line(proc, "READY", timeout=120)
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
    resumed = run_worker(run_dir, STEPS, "--out", out)
    assert "DONE step=20" in resumed
    _assert_identical(*straight, run_dir, out)
