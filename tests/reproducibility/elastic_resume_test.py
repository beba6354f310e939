"""Elastic resume: a run checkpointed on one number of processes and mesh continues on another
and trains what one uninterrupted process trains. One run grows, reshapes and shrinks: 1 process
x 8 devices (mesh data=8), killed after checkpoint 4 -> 4 processes x 2 devices with mesh data=2,
model=4, killed after checkpoint 8 -> 1 process x 8 devices (data=8) to step 12, against the
standard run (tests/fixtures/standard_runs.py). The global batch at step s depends only on the
seed and s, so every layout reads the same rows (batch fingerprints compared bitwise); losses and
parameter sums agree within rtol 1e-5 (other layouts sum in other orders).

The middle stage is also the check that four hosts feed one model: its model axis spans the
processes (two hosts feed each data-parallel replica and read the same rows), and its steps 5-8
are the standard run's (its header has the config hash, mesh and data fingerprint of the standard
run "t5_data2_model4", 1 process x 8 devices with that mesh; its batches at steps 6 and 8 are the
standard runs'). One chain of six processes instead of this run's four and a 4-process run of
its own: each process pays its start-up and compile."""

import standard_runs as sr
import train_runs

MIDDLE = sr.MESH_DATA2_MODEL4  # the model axis (4) across the 4 processes of 2 devices each


def test_one_then_four_processes_with_the_model_axis_across_them_then_one(tmp_path):
    standard = sr.unpack(tmp_path)
    run = tmp_path / "elastic"
    procs, logs = train_runs.start_group(run, standard, 1, 8, tag="-1x8")
    train_runs.kill_after_checkpoint(run, procs, logs, 4)
    procs, logs = train_runs.start_group(run, standard, 4, 2, MIDDLE, tag="-4x2")
    train_runs.kill_after_checkpoint(run, procs, logs, 8)
    assert "restored step 4" in logs[0].read_text(), train_runs.tail(logs[0])
    # The 4-process stage's header (the final stage writes its own): the standard run of its mesh.
    four, one = sr.header(run), sr.header(standard.run("t5_data2_model4"))
    assert (four["process_count"], one["process_count"]) == (4, 1)
    assert four["device_count"] == one["device_count"] == 8 and four["mesh"] == one["mesh"]
    assert four["config_hash"] == one["config_hash"] and four["data_fingerprint"] == one["data_fingerprint"]
    middle = sr.batch_fingerprints(run)
    log = train_runs.train(run, standard)
    assert "restored step 8" in log.read_text(), train_runs.tail(log)

    reference = standard.run("t5")
    want, got = sr.batch_fingerprints(reference), sr.batch_fingerprints(run)
    assert sorted(got) == list(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))
    assert got == want
    assert {s: middle[s] for s in (6, 8)} == {s: want[s] for s in (6, 8)}  # the 4 processes' batches
    assert sr.header(run)["process_count"] == 1
    assert set(range(1, sr.STEPS + 1)) <= set(train_runs.logged_steps(run))
    report = sr.verify(reference, run, "--rtol=1e-5", "--allow_config_diff")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    assert f"{len(want)} batch fingerprints compared" in report.stdout, report.stdout
    for i in range(4):  # steps 5-8 were trained by the 4 processes (each logs them with its name)
        text = logs[i].read_text(errors="replace")
        assert f"process {i}/4: train step 8:" in text, train_runs.tail(logs[i])
