"""Any host count and any mesh trains the same model: the real train entry point on
(a) 4 processes x 2 devices with mesh data=2, model=4 (the model axis spans processes, so two
hosts feed each data-parallel replica), and (b) 2 processes x 4 devices with data=2, fsdp=2,
model=2 and the FSDP rules, each against 1 process x 8 devices with the same mesh. The global
batch of every step is identical (batch fingerprints, compared bitwise), and losses and
parameter sums agree within rtol 1e-5 (`//launchers:verify`): the processes' partial sums
reach the all-reduces in another order, so the last bits may differ."""

import json

import pytest
import train_runs

STEPS = 10


def batch_fingerprints(model_dir):
    rows = [json.loads(line) for line in (model_dir / "fingerprint" / "batches.jsonl").read_text().splitlines()]
    return {r["step"]: r["batch_sha256"] for r in rows}


@pytest.mark.parametrize(
    "processes,devices_each,mesh",
    [
        (4, 2, ["--config.partitioning.mesh.data=2", "--config.partitioning.mesh.model=4"]),
        (
            2,
            4,
            [
                "--config.partitioning.mesh.data=2",
                "--config.partitioning.mesh.fsdp=2",
                "--config.partitioning.mesh.model=2",
                "--config.partitioning.fsdp_rules=True",
            ],
        ),
    ],
    ids=["4x2_data2_model4", "2x4_data2_fsdp2_model2"],
)
def test_layout_matches_one_process(tmp_path, processes, devices_each, mesh):
    cache = tmp_path / "cache"
    mesh = mesh + ["--config.fingerprint_every=1"]  # batch fingerprints and checksums at every step
    one, many = tmp_path / "one_process", tmp_path / f"{processes}_processes"
    train_runs.train(one, cache, extra=tuple(mesh), steps=STEPS)
    train_runs.train_multiprocess(many, cache, processes, devices_each, extra=tuple(mesh), steps=STEPS)
    h1 = json.loads((one / "fingerprint" / "header.json").read_text())
    hn = json.loads((many / "fingerprint" / "header.json").read_text())
    assert (h1["process_count"], hn["process_count"]) == (1, processes)
    assert h1["mesh"] == hn["mesh"] and h1["data_fingerprint"] == hn["data_fingerprint"]
    b1, bn = batch_fingerprints(one), batch_fingerprints(many)
    assert sorted(b1) == sorted(bn) == list(range(1, STEPS + 1))
    assert b1 == bn  # the same global rows at every step
    assert len(set(b1.values())) == STEPS
    report = train_runs.verify(one, many, "--rtol=1e-5")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {STEPS}" in report.stdout, report.stdout
    assert f"{STEPS} batch fingerprints compared" in report.stdout, report.stdout
