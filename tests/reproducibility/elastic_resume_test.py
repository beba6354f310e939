"""Elastic resume: a run checkpointed on one number of processes and mesh continues on another
and trains what one uninterrupted process trains. One run grows, reshapes and shrinks: 1 process
x 8 devices (mesh data=8), killed after checkpoint 4 -> 2 processes x 4 devices with mesh data=4,
model=2, killed after checkpoint 8 -> 1 process x 8 devices (data=8) to step 12, against the
standard run (tests/fixtures/standard_runs.py). The global batch at step s depends only on the
seed and s, so every layout reads the same rows (batch fingerprints compared bitwise); losses and
parameter sums agree within rtol 1e-5 (other layouts sum in other orders). Four processes reading
one global batch are in `model_axis_test`."""

import standard_runs as sr
import train_runs

RESHAPED = ("--config.partitioning.mesh.data=4", "--config.partitioning.mesh.model=2")


def test_one_then_two_processes_on_another_mesh_then_one(tmp_path):
    standard = sr.unpack(tmp_path)
    run = tmp_path / "elastic"
    procs, logs = train_runs.start_group(run, standard, 1, 8, tag="-1x8")
    train_runs.kill_after_checkpoint(run, procs, logs, 4)
    procs, logs = train_runs.start_group(run, standard, 2, 4, RESHAPED, tag="-2x4")
    train_runs.kill_after_checkpoint(run, procs, logs, 8)
    assert "restored step 4" in logs[0].read_text(), train_runs.tail(logs[0])
    log = train_runs.train(run, standard)
    assert "restored step 8" in log.read_text(), train_runs.tail(log)

    reference = standard.run("t5")
    want, got = sr.batch_fingerprints(reference), sr.batch_fingerprints(run)
    assert sorted(got) == list(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))
    assert got == want
    assert sr.header(run)["process_count"] == 1
    report = sr.verify(reference, run, "--rtol=1e-5", "--allow_config_diff")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    assert f"{len(want)} batch fingerprints compared" in report.stdout, report.stdout
