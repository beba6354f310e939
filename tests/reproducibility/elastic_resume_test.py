"""Elastic resume, and other host counts and meshes training the same model: a run checkpointed
on one number of processes and mesh continues on another and trains what one uninterrupted
process trains. One run grows, reshapes and shrinks: 1 process x 8 devices (mesh data=8), killed
after checkpoint 4 -> 4 processes x 2 devices with mesh data=2, model=4, killed after checkpoint
8 -> 2 processes x 4 devices with mesh data=2, fsdp=2, model=2 and the FSDP rules to step 12,
against the standard run (tests/fixtures/standard_runs.py). The global batch at step s depends
only on the seed and s, so every layout reads the same rows (batch fingerprints compared
bitwise); losses and parameter sums agree within rtol 1e-5 (other layouts sum in other orders).

Each stage is a layout property too, checked against the standard run of its mesh on 1 process x
8 devices (its header: config hash, mesh, device count, data fingerprint):
- four hosts feed one model: the 4-process stage's model axis spans the processes (two hosts
  feed each data-parallel replica and read the same rows); standard run "t5_data2_model4";
- a job started the way a cluster scheduler does (`CAIRN_COORDINATOR_ADDRESS`,
  `CAIRN_NUM_PROCESSES`, `CAIRN_PROCESS_ID` in the environment): the last stage, with the FSDP
  mesh; process 0 prints, process 1 does not (nor Gloo's connection lines); config.json keeps
  `multihost.num_processes` unset;
  standard run "t5_data2_fsdp2_model2".
(One chain of seven processes instead of three runs of four, four and two: each process pays
its start-up and compile.)"""

import json

import standard_runs as sr
import train_runs

MODEL_ACROSS = sr.MESH_DATA2_MODEL4  # the model axis (4) across 4 processes of 2 devices each


def same_layout_as(run, standard_run, processes):
    """`run`'s header (the stage that wrote it last) is the standard run's but for the process count."""
    got, want = sr.header(run), sr.header(standard_run)
    assert (got["process_count"], want["process_count"]) == (processes, 1)
    assert got["device_count"] == want["device_count"] == 8 and got["mesh"] == want["mesh"]
    # The multihost section and model_dir are outside the hash; the data is a function of (seed, step).
    assert got["config_hash"] == want["config_hash"] and got["data_fingerprint"] == want["data_fingerprint"]


def test_one_then_four_processes_then_two_configured_by_the_environment(tmp_path):
    standard = sr.unpack(tmp_path)
    run = tmp_path / "elastic"
    procs, logs = train_runs.start_group(run, standard, 1, 8, tag="-1x8")
    train_runs.kill_after_checkpoint(run, procs, logs, 4)

    procs, logs = train_runs.start_group(run, standard, 4, 2, MODEL_ACROSS, tag="-4x2")
    train_runs.kill_after_checkpoint(run, procs, logs, 8)
    assert "restored step 4" in logs[0].read_text(), train_runs.tail(logs[0])
    assert "checkpoint at step 8" in logs[0].read_text(errors="replace"), train_runs.tail(logs[0])
    for i in range(1, 4):  # process 0 speaks: the others print no progress, metrics or Gloo lines
        text = logs[i].read_text(errors="replace")
        assert "train step" not in text and "checkpoint at step" not in text, train_runs.tail(logs[i])
        assert "[Gloo]" not in text and "peer ranks" not in text, train_runs.tail(logs[i])
    same_layout_as(run, standard.run("t5_data2_model4"), 4)
    middle = sr.batch_fingerprints(run)

    logs = train_runs.train_group_from_environment(run, standard, 2, 4, sr.MESH_FSDP)
    (out0, err0), (out1, _) = [(o.read_text(errors="replace"), e.read_text(errors="replace")) for o, e in logs]
    assert "restored step 8" in err0, err0[-3000:]
    assert f"trained to step {sr.STEPS}" in out0 and "model_dir:" in out0, out0
    assert out1.strip() == "", out1  # process 0 prints; process 1 computes (and Gloo is silenced)
    config = json.loads((run / "config.json").read_text())
    assert config["multihost"]["num_processes"] is None  # from the environment, not the config
    same_layout_as(run, standard.run("t5_data2_fsdp2_model2"), 2)

    reference = standard.run("t5")
    want, got = sr.batch_fingerprints(reference), sr.batch_fingerprints(run)
    assert sorted(got) == list(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))
    assert got == want and len(set(want.values())) == len(want)
    assert {s: middle[s] for s in (6, 8)} == {s: want[s] for s in (6, 8)}  # the 4 processes' batches
    assert set(range(1, sr.STEPS + 1)) <= set(train_runs.logged_steps(run))
    report = sr.verify(reference, run, "--rtol=1e-5", "--allow_config_diff")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    assert f"{len(want)} batch fingerprints compared" in report.stdout, report.stdout
