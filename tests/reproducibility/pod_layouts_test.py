"""Any host count and any mesh trains the same model: the real train entry point on
(a) 2 processes x 4 devices with mesh data=2, fsdp=2, model=2 and the FSDP rules, started the way
a cluster scheduler does (`CAIRN_COORDINATOR_ADDRESS`, `CAIRN_NUM_PROCESSES`, `CAIRN_PROCESS_ID`
in the environment), and (b) 4 processes x 2 devices with mesh data=2, model=4 (the model axis
spans processes, so two hosts feed each data-parallel replica), each against the standard run of
1 process x 8 devices with the same mesh (tests/fixtures/standard_runs.py). The global batch of
every fingerprinted step is identical (batch fingerprints, compared bitwise), and losses and
parameter sums agree within rtol 1e-5 (`//launchers:verify`): the processes' partial sums reach
the all-reduces in another order, so the last bits may differ."""

import json
import subprocess
import sys

import pytest
import standard_runs as sr
import train_runs

FINGERPRINTED = list(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    return sr.unpack(tmp_path_factory.mktemp("layouts"))


def check_matches_one_process(one, many, processes):
    h1, hn = sr.header(one), sr.header(many)
    assert (h1["process_count"], hn["process_count"]) == (1, processes)
    assert h1["device_count"] == hn["device_count"] == 8
    assert h1["mesh"] == hn["mesh"]
    # The multihost section and model_dir are outside the hash; the data is a function of (seed, step).
    assert h1["config_hash"] == hn["config_hash"] and h1["data_fingerprint"] == hn["data_fingerprint"]
    b1, bn = sr.batch_fingerprints(one), sr.batch_fingerprints(many)
    assert sorted(b1) == sorted(bn) == FINGERPRINTED
    assert b1 == bn  # the same global rows at every step
    assert len(set(b1.values())) == len(FINGERPRINTED)
    report = sr.verify(one, many, "--rtol=1e-5")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    assert f"{len(FINGERPRINTED)} batch fingerprints compared" in report.stdout, report.stdout
    assert set(range(1, sr.STEPS + 1)) <= set(train_runs.logged_steps(many))


def test_two_processes_configured_by_the_environment_match_one(standard, tmp_path):
    many = tmp_path / "two_processes"
    env = sr.child_env(
        standard.texts,
        4,
        CAIRN_COORDINATOR_ADDRESS=f"127.0.0.1:{sr.free_port()}",
        CAIRN_NUM_PROCESSES="2",
    )
    args = sr.overrides(many, standard.cache, extra=sr.MESH_FSDP)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cairn.launchers.train_main", *args],
            env=dict(env, CAIRN_PROCESS_ID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(sr.REPO),
            start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=train_runs.TIMEOUT_S) for p in procs]
    finally:
        train_runs.kill_all(procs)
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert f"trained to step {sr.STEPS}" in outs[0][0] and "model_dir:" in outs[0][0]
    # Process 0 prints; process 1 computes. Gloo's start-up message ("[Gloo] Rank 1 is connected
    # to 1 peer ranks...") comes in pieces that can land on separate lines.
    ours = [
        line
        for line in outs[1][0].splitlines()
        if line.strip() and not line.startswith("[Gloo]") and "peer ranks" not in line
    ]
    assert ours == [], ours
    config = json.loads((many / "config.json").read_text())
    assert config["multihost"]["num_processes"] is None  # from the environment, not the config
    check_matches_one_process(standard.run("t5_data2_fsdp2_model2"), many, 2)


def test_four_processes_with_the_model_axis_across_them_match_one(standard, tmp_path):
    many = tmp_path / "four_processes"
    procs, logs = train_runs.start_group(many, standard, 4, 2, sr.MESH_DATA2_MODEL4)
    train_runs.finish_group(procs, logs)
    check_matches_one_process(standard.run("t5_data2_model4"), many, 4)
