"""Row digests of host batches: replica-mates must feed identical rows, and the global batch
fingerprint is the same for any number of hosts (2 processes x 2 devices on 127.0.0.1)."""

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from cairn.partitioning import DataLayout, GatheredDigests, ReplicaBatchMismatchError, gather_row_digests, row_digests

WORKER = pathlib.Path(__file__).absolute().with_name("consistency_worker.py")
TIMEOUT_S = 240


def batch(rows):
    return {"targets": np.asarray(rows, np.int32).reshape(-1, 3), "weights": np.ones((len(rows) // 3, 3), np.float32)}


def test_row_digests_depend_on_every_feature_and_row():
    a = row_digests(batch(range(12)))
    assert a.shape == (4, 32) and a.dtype == np.uint8
    assert len({bytes(r) for r in a}) == 4
    b = batch(range(12))
    b["weights"][2, 1] = 0.5
    changed = row_digests(b)
    assert [bytes(x) == bytes(y) for x, y in zip(a, changed)] == [True, True, False, True]
    with pytest.raises(ValueError, match="different row counts"):
        row_digests({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))})


def test_fingerprint_is_independent_of_the_number_of_shards():
    whole = row_digests(batch(range(24)))
    one = GatheredDigests(np.array([0]), 1, whole[None])
    halves = GatheredDigests(np.array([1, 0, 1, 0]), 2, np.stack([whole[4:], whole[:4], whole[4:], whole[:4]]))
    assert one.fingerprint() == halves.fingerprint()
    halves.check(step=3)
    assert gather_row_digests(batch(range(24)), DataLayout(0, 1)).fingerprint() == one.fingerprint()


def test_mismatch_names_the_processes_and_the_step():
    d = row_digests(batch(range(24)))
    bad = GatheredDigests(np.array([0, 0, 1, 1]), 2, np.stack([d[:4], d[:4], d[4:], d[:4]]))
    assert bad.mismatches() == [(1, [2, 3])]
    with pytest.raises(ReplicaBatchMismatchError, match=r"step 12: processes \[2, 3\] hold data shard 1 of 2"):
        bad.check(step=12)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_module():
    """consistency_worker.py as a module (the one-process reference runs its code here)."""
    spec = importlib.util.spec_from_file_location("consistency_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path, name, num_processes, local_devices, model):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    port = free_port()
    outs = [tmp_path / f"{name}.{i}.json" for i in range(num_processes)]
    procs = []
    try:
        for i in range(num_processes):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER),
                        str(num_processes),
                        str(i),
                        str(port),
                        str(local_devices),
                        str(model),
                        str(outs[i]),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            assert p.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return [json.loads(o.read_text()) for o in outs]


def test_model_axis_across_processes(tmp_path):
    # model=4 over 2 processes x 2 devices: one replica spans both hosts, which must feed the
    # same rows; the global batch fingerprint equals one process's (this one, holding all rows).
    worker = _worker_module()
    single = worker.fingerprint(worker.global_batch(), DataLayout(0, 1))
    runs = run(tmp_path, "two", 2, 2, 4)
    assert [(r["shard_id"], r["num_shards"]) for r in runs] == [(0, 1), (0, 1)]
    assert runs[0]["fingerprint"] == runs[1]["fingerprint"] == single["fingerprint"]
    # Rows chosen by process id (what the reader did before it followed the mesh): refused,
    # on both processes, in the same run.
    for r in runs:
        assert "step 7: processes [0, 1] hold data shard 0 of 1" in r["wrong_error"], r
