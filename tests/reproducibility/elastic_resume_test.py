"""Elastic resume: a run checkpointed on one number of processes continues on another and
trains what one uninterrupted process trains. The global batch at step s depends only on the
seed and s, so every resumed layout reads the same rows (batch fingerprints compared bitwise);
losses and parameter sums agree within rtol 1e-5 (other layouts sum in other orders).

(e1) 4 processes x 2 devices, killed after checkpoint 4 -> 2 x 4, killed after checkpoint 8
     -> 1 x 8 to step 12;
(e2) 1 process x 8 devices (mesh data=8), killed after checkpoint 4 -> 4 x 2 processes with
     mesh data=4, model=2 (another mesh shape, several processes) to step 12.
"""

import json

import pytest
import train_runs

STEPS = 12
COMMON = ("--config.trainer.checkpoint_every=4", "--config.trainer.keep_checkpoints=0", "--config.fingerprint_every=2")


def batches(model_dir):
    rows = [json.loads(line) for line in (model_dir / "fingerprint" / "batches.jsonl").read_text().splitlines()]
    return {r["step"]: r["batch_sha256"] for r in rows}  # the last row of a step wins (resumed runs)


def segment(run, cache, processes, devices_each, kill_at=None, mesh=()):
    extra = COMMON + tuple(mesh)
    if processes == 1:
        proc = train_runs.start(
            train_runs.overrides(run, cache, STEPS) + list(extra),
            devices_each,
            log := run.parent / f"{run.name}-{kill_at}.log",
        )
        procs, logs = [proc], [log]
    else:
        procs, logs = train_runs.start_multiprocess(
            run, cache, processes, devices_each, extra, STEPS, tag=f"-{kill_at}"
        )
    if kill_at is not None:
        train_runs.kill_after_checkpoint(run, procs, logs, kill_at)
        return
    try:
        for p, log in zip(procs, logs):
            train_runs.finish(p, log)
    finally:
        train_runs.kill_all(procs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    cache, run = tmp / "cache", tmp / "reference"
    segment(run, cache, 1, 8)
    return cache, run


def check_same(reference_run, resumed):
    want, got = batches(reference_run), batches(resumed)
    assert sorted(got) == list(range(2, STEPS + 1, 2)) and got == want
    report = train_runs.verify(reference_run, resumed, "--rtol=1e-5", "--allow_config_diff")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {STEPS}" in report.stdout, report.stdout
    assert f"{STEPS // 2} batch fingerprints compared" in report.stdout, report.stdout


def test_resume_on_four_then_two_then_one_process(reference, tmp_path):
    cache, ref = reference
    run = tmp_path / "elastic"
    segment(run, cache, 4, 2, kill_at=4)
    segment(run, cache, 2, 4, kill_at=8)
    segment(run, cache, 1, 8)
    assert "restored step 8" in (tmp_path / "elastic-None.log").read_text()
    check_same(ref, run)


def test_resume_one_process_on_four_with_another_mesh(reference, tmp_path):
    cache, ref = reference
    run = tmp_path / "remeshed"
    segment(run, cache, 1, 8, kill_at=4, mesh=("--config.partitioning.mesh.data=8",))
    segment(run, cache, 4, 2, mesh=("--config.partitioning.mesh.data=4", "--config.partitioning.mesh.model=2"))
    header = json.loads((run / "fingerprint" / "header.json").read_text())
    assert header["process_count"] == 4 and header["mesh"]["model"] == 2
    assert "restored step 4" in (tmp_path / "remeshed-None-p0.log").read_text()
    check_same(ref, run)
