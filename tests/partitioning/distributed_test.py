"""Multi-host: 2 processes x 4 CPU devices on 127.0.0.1 give what 1 process x 8 devices (this one)
gives."""

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from cairn.partitioning import DistributedConfig, initialize_distributed, resolve_distributed

WORKER = pathlib.Path(__file__).absolute().with_name("multihost_worker.py")
TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(num_processes: int, local_devices: int, out_prefix: str) -> None:
    env = dict(os.environ)  # keeps PYTHONPATH (Bazel's stub sets it) so workers find cairn
    env.pop("XLA_FLAGS", None)
    port = free_port()
    procs = []
    try:
        for pid in range(num_processes):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER),
                        str(num_processes),
                        str(pid),
                        str(port),
                        str(local_devices),
                        out_prefix,
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        deadline = time.monotonic() + TIMEOUT_S
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, f"worker exited {p.returncode}:\n{out[-4000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _worker_module():
    """multihost_worker.py as a module: the one-process reference runs its code here (8 devices)."""
    spec = importlib.util.spec_from_file_location("multihost_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_processes_match_one(tmp_path):
    _worker_module().run(1, 0, free_port(), str(tmp_path / "single"))
    run_workers(2, 4, str(tmp_path / "multi"))
    want = np.load(tmp_path / "single.0.npz")
    meta = [json.loads((tmp_path / f"multi.{i}.json").read_text()) for i in range(2)]
    assert [m["mode"] for m in meta] == ["explicit", "explicit"]
    assert [m["local_devices"] for m in meta] == [4, 4]
    assert meta[0]["hybrid_row_processes"] == [[0], [1]]
    # batch over data x fsdp = 4 row blocks: each host feeds its own half.
    assert [(m["shard_id"], m["num_shards"]) for m in meta] == [(0, 2), (1, 2)]
    assert json.loads((tmp_path / "single.0.json").read_text())["mode"] == "single"
    for i in range(2):
        got = np.load(tmp_path / f"multi.{i}.npz")
        assert meta[i]["w1_spec"] == "P('fsdp', 'model')"
        for key in want.files:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)


def test_resolve_explicit_flags_win_over_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert resolve_distributed(env=env) == DistributedConfig("explicit", "10.0.0.1:1234", 4, 3)
    assert resolve_distributed("h:1", 2, 1, env=env) == DistributedConfig("explicit", "h:1", 2, 1)


def test_resolve_single_process_and_errors():
    assert resolve_distributed(env={}) == DistributedConfig("single")
    assert resolve_distributed(num_processes=1, env={}).mode == "single"
    with pytest.raises(ValueError, match=r"missing \['coordinator_address', 'process_id'\]"):
        resolve_distributed(num_processes=2, env={})
    with pytest.raises(ValueError, match=r"process_id 2 is not in \[0, num_processes=2\)"):
        resolve_distributed("h:1", 2, 2, env={})
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer"):
        resolve_distributed(env={"JAX_NUM_PROCESSES": "two"})


def test_resolve_clusters():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16", "SLURM_PROCID": "5"}
    assert resolve_distributed(env=slurm) == DistributedConfig("auto", num_processes=16, process_id=5)
    assert resolve_distributed(env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}).mode == "single"
    tpu = {"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3", "TPU_WORKER_ID": "2"}
    assert resolve_distributed(env=tpu) == DistributedConfig("auto", num_processes=4, process_id=2)
    assert resolve_distributed(env={"TPU_WORKER_HOSTNAMES": "localhost"}).mode == "single"


def test_initialize_is_a_noop_on_one_process(monkeypatch):
    for name in (
        "JAX_COORDINATOR_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
        "SLURM_JOB_ID",
        "TPU_WORKER_HOSTNAMES",
        "MEGASCALE_COORDINATOR_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    import jax

    assert initialize_distributed().mode == "single"
    assert not jax.distributed.is_initialized() and jax.process_count() == 1
