"""The train entry point on 2 processes x 4 CPU devices on 127.0.0.1 (`CAIRN_*` environment):
the same losses as 1 process x 8 devices, one config.json, output from process 0 only."""

import json
import os
import socket
import subprocess
import sys

import launch_util


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(model_dir):
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "summaries", "metrics.jsonl"))]
    return {r["step"]: r["value"] for r in rows if r["task"] == "train" and r["metric"] == "loss"}


def args(model_dir, cache_dir):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        "--config.num_train_steps=4",
        "--config.data.batch_size=8",
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        "--config.trainer.log_every=1",
    ]


def test_two_processes_match_one(tmp_path):
    texts = launch_util.small_texts(tmp_path)
    cache = tmp_path / "cache"
    port = free_port()
    env = dict(
        os.environ,
        CAIRN_SHAKESPEARE_DIR=texts,
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="2",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        CAIRN_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        CAIRN_NUM_PROCESSES="2",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cairn.launchers.train_main"] + args(tmp_path / "two", cache),
            env=dict(env, CAIRN_PROCESS_ID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(launch_util.REPO),
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=400))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "trained to step 4" in outs[0][0] and "model_dir:" in outs[0][0]
    # Gloo's start-up message ("[Gloo] Rank 1 is connected to 1 peer ranks...") comes in
    # pieces that can land on separate lines.
    ours = [
        line
        for line in outs[1][0].splitlines()
        if line.strip() and not line.startswith("[Gloo]") and "peer ranks" not in line
    ]
    assert ours == [], ours  # process 1 computes, process 0 prints
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["multihost"]["num_processes"] is None  # from the environment, not the config
    header = json.loads((tmp_path / "two" / "fingerprint" / "header.json").read_text())
    assert header["process_count"] == 2 and header["device_count"] == 8

    proc = launch_util.train(args(tmp_path / "one", cache), env={"CAIRN_SHAKESPEARE_DIR": texts})
    assert proc.returncode == 0, launch_util.tail(proc)
    two, one = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert sorted(two) == sorted(one) == [1, 2, 3, 4]
    for step in one:
        assert abs(two[step] - one[step]) <= 1e-5 * abs(one[step]), (step, two[step], one[step])
    header_one = json.loads((tmp_path / "one" / "fingerprint" / "header.json").read_text())
    assert header_one["config_hash"] == header["config_hash"]  # model_dir and multihost are not hashed
    assert header_one["data_fingerprint"] == header["data_fingerprint"]
