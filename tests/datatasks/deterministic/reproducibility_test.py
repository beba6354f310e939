"""Same seed => byte-identical first 300 global batches in two separate processes; the
state saved at step k in {0, 1, 17, 299} restores the uninterrupted run, through the reader's
NumPy stage and through its TensorFlow stage.

300 steps of det_mix (4 packed rows a step) reach epoch 2 of det_a and epoch 4 of det_b, so
they cross epochs of both tasks within the mixture (1,000 steps would only cross more of
them). Both processes read through the NumPy stage
(the tasks' post-cache `noise` has a NumPy twin): the child never imports TensorFlow
(asserted), and the restored readers at steps 17 and 299 run `noise` in TensorFlow instead
(`det_tasks.make(..., tf_noise=True)`), so the child's NumPy batches are also TensorFlow's."""

import json
import os
import subprocess
import sys

import det_run
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 303


@pytest.fixture(scope="module")
def two_runs(det_env):
    """The same run (det_mix, packed, seed 7, the reader's defaults) in a child process and,
    meanwhile, in this one: two processes, each with its own reader, registry and hash seed."""
    data_dir, cache_dir, _ = det_env
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, *sys.path])
    cmd = [sys.executable, os.path.join(HERE, "det_run.py"), data_dir, cache_dir, "det_mix", "1", str(STEPS)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = det_run.reader(data_dir, cache_dir, "det_mix", True)
        assert all(s.numpy_stage is not None for s in reader.streams)
        here = det_run.run(reader, STEPS)
        reader.close()
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    got = json.loads(out.strip().splitlines()[-1])
    assert got["tensorflow_imported"] is False
    return got["run"], here


def test_two_processes_give_identical_batches(two_runs):
    a, b = two_runs
    assert len(a) == len(b) == STEPS
    assert [x["digest"] for x in a[:300]] == [x["digest"] for x in b[:300]]
    assert [x["state"] for x in a] == [x["state"] for x in b]
    assert len({x["digest"] for x in a}) > 297  # batches do differ from step to step


@pytest.mark.parametrize(("k", "stage"), [(0, "numpy"), (1, "numpy"), (17, "tensorflow"), (299, "tensorflow")])
def test_restore_at_step_k(det_env, two_runs, k, stage):
    data_dir, cache_dir, _ = det_env
    run = two_runs[0]  # the child's
    # A fresh reader that computes 3 steps at a time and nothing ahead (the runs computed 64
    # and prefetched 2 chunks): restoring depends on the state only.
    reader = det_run.reader(
        data_dir, cache_dir, "det_mix", True, prefetch=0, steps_per_call=3, tf_noise=stage == "tensorflow"
    )
    assert all((s.numpy_stage is None) == (stage == "tensorflow") for s in reader.streams)
    reader.set_state(run[k]["state"])
    assert run[k]["state"]["step"] == k
    got = [det_run.digest(next(reader)) for _ in range(STEPS - k if k > 290 else 3)]
    assert got == [x["digest"] for x in run[k : k + len(got)]]
