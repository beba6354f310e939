"""Another host count and mesh trains the same model: the real train entry point on 2 processes x 4
devices with mesh data=2, fsdp=2, model=2 and the FSDP rules, started the way a cluster scheduler
does (`CAIRN_COORDINATOR_ADDRESS`, `CAIRN_NUM_PROCESSES`, `CAIRN_PROCESS_ID` in the environment),
against the standard run of 1 process x 8 devices with the same mesh
(tests/fixtures/standard_runs.py); process 0 prints, process 1 does not. (4 processes with the
model axis across them: `model_axis_test`.) The global batch of
every fingerprinted step is identical (batch fingerprints, compared bitwise), and losses and
parameter sums agree within rtol 1e-5 (`//launchers:verify`): the processes' partial sums reach
the all-reduces in another order, so the last bits may differ."""

import json
import subprocess
import sys

import pytest
import standard_runs as sr
import train_runs


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    return sr.unpack(tmp_path_factory.mktemp("layouts"))


def test_two_processes_configured_by_the_environment_match_one(standard, tmp_path):
    many = tmp_path / "two_processes"
    env = sr.child_env(
        standard.texts,
        4,
        CAIRN_COORDINATOR_ADDRESS=f"127.0.0.1:{sr.free_port()}",
        CAIRN_NUM_PROCESSES="2",
    )
    args = sr.overrides(many, standard.cache, extra=sr.MESH_FSDP)
    # Each stream to a file: a pipe left undrained while another process is waited for fills up
    # (the INFO log of 12 steps) and blocks that process short of the shutdown barrier.
    logs = [(tmp_path / f"p{i}.out", tmp_path / f"p{i}.err") for i in range(2)]
    procs = []
    try:
        for i, (out, err) in enumerate(logs):
            with open(out, "w") as o, open(err, "w") as e:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cairn.launchers.train_main", *args],
                        env=dict(env, CAIRN_PROCESS_ID=str(i)),
                        stdout=o,
                        stderr=e,
                        cwd=str(sr.REPO),
                        start_new_session=True,
                    )
                )
        codes = [p.wait(timeout=train_runs.TIMEOUT_S) for p in procs]
    finally:
        train_runs.kill_all(procs)
    outs = [(out.read_text(errors="replace"), err.read_text(errors="replace")) for out, err in logs]
    for code, (_out, err) in zip(codes, outs):
        assert code == 0, err[-3000:]
    assert f"trained to step {sr.STEPS}" in outs[0][0] and "model_dir:" in outs[0][0]
    # Process 0 prints; process 1 computes. Gloo's start-up message ("[Gloo] Rank 1 is connected
    # to 1 peer ranks...") comes in pieces that can land on separate lines (a piece may be a lone
    # "1"): a line that is part of that message is Gloo's.
    gloo = "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
    ours = [
        line
        for line in outs[1][0].splitlines()
        if line.strip() and not line.startswith("[Gloo]") and "peer ranks" not in line and line.strip() not in gloo
    ]
    assert ours == [], ours
    config = json.loads((many / "config.json").read_text())
    assert config["multihost"]["num_processes"] is None  # from the environment, not the config
    train_runs.check_matches_one_process(standard.run("t5_data2_fsdp2_model2"), many, 2)
