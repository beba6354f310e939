"""(a) A run SIGKILLed after step 6 (checkpoint 4 complete) and resumed ends bit-identical to the uninterrupted standard
run (tests/fixtures/standard_runs.py, trained by another process at build time): every step's
loss, the batch fingerprints and the parameter checksums (`verify`, exact), with the same config
hash and data fingerprint. The killed run's first steps are a fresh run with the same seed, so
this is also "two fresh runs are identical". (b) A run with another seed: `verify` refuses the
config difference unless it is allowed, then names step 1 and exits 1. Both through the real
`train` entry point."""

import json

import pytest
import standard_runs as sr
import train_runs


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    return sr.unpack(tmp_path_factory.mktemp("repro"))


def test_kill_and_resume_is_bit_identical(standard, tmp_path):
    straight, resumed = standard.run("t5"), tmp_path / "resumed"
    killed_at = train_runs.train_and_kill(resumed, standard, after_step=6, after_checkpoint=4)
    assert 6 <= killed_at < sr.STEPS, killed_at
    log = train_runs.train(resumed, standard)  # restarts from the checkpoint on disk
    assert "restored step 4 from" in log.read_text(), train_runs.tail(log)
    report = sr.verify(straight, resumed)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    # Every step's loss is compared, and the checksums at 2, 4, ..., 12.
    assert set(range(1, sr.STEPS + 1)) <= set(train_runs.logged_steps(resumed))
    rows = [json.loads(x) for x in (resumed / "fingerprint" / "checksums.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} >= set(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))
    header_a, header_b = sr.header(straight), sr.header(resumed)
    assert header_a["config_hash"] == header_b["config_hash"]
    assert header_a["data_fingerprint"] == header_b["data_fingerprint"]


def test_verify_names_the_step_where_a_perturbed_run_diverges(standard, tmp_path):
    """A different seed changes the data and the init: verify reports step 1 (after the
    config difference, which it allows on request) and exits 1."""
    other = tmp_path / "other_seed"
    train_runs.train(other, standard, extra=("--config.seed=1",), steps=2)
    plain = sr.verify(standard.run("t5"), other)
    assert plain.returncode == 1 and "config" in (plain.stdout + plain.stderr).lower()
    report = sr.verify(standard.run("t5"), other, "--allow_config_diff")
    assert report.returncode == 1, report.stdout + report.stderr
    assert "first divergent step: 1 " in report.stdout, report.stdout
