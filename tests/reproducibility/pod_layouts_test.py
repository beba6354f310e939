"""Another host count and mesh trains the same model: the real train entry point on 2 processes x 4
devices with mesh data=2, fsdp=2, model=2 and the FSDP rules, started the way a cluster scheduler
does (`CAIRN_COORDINATOR_ADDRESS`, `CAIRN_NUM_PROCESSES`, `CAIRN_PROCESS_ID` in the environment),
against the standard run of 1 process x 8 devices with the same mesh
(tests/fixtures/standard_runs.py); process 0 prints, process 1 does not. (4 processes with the
model axis across them: the middle stage of `elastic_resume_test`.) The global batch of
every fingerprinted step is identical (batch fingerprints, compared bitwise), and losses and
parameter sums agree within rtol 1e-5 (`//launchers:verify`): the processes' partial sums reach
the all-reduces in another order, so the last bits may differ."""

import json

import forks
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
    # The two processes forked together from one interpreter that imported the train program
    # (`forks.run_forked`), each with its own CAIRN_PROCESS_ID.
    procs = forks.run_forked(
        train_runs.TRAIN,
        [args, args],
        env=env,
        timeout=train_runs.TIMEOUT_S,
        preload=train_runs.PRELOAD,
        together=True,
        child_envs=[{"CAIRN_PROCESS_ID": str(i)} for i in range(2)],
    )
    outs = [(p.stdout, p.stderr) for p in procs]
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
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
