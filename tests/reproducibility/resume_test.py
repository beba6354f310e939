"""(a) 30 steps straight == 15 steps, SIGKILL, resume to 30: bit-identical losses and params.
(b) Two fresh runs with one seed are identical. Both through the real `train` entry point
and the run fingerprints `//launchers:verify` reads."""

import json

import pytest
import train_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    cache = root / "cache"
    straight = root / "straight"
    train_runs.train(straight, cache)  # also caches the task for the runs below
    return root, cache, straight


def test_kill_and_resume_is_bit_identical(runs):
    root, cache, straight = runs
    resumed = root / "resumed"
    killed_at = train_runs.train_and_kill(resumed, cache, after_step=15)
    assert 15 <= killed_at < train_runs.STEPS, killed_at
    train_runs.train(resumed, cache)  # restarts from whatever checkpoint is on disk
    report = train_runs.verify(straight, resumed)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {train_runs.STEPS}" in report.stdout, report.stdout
    # Every step's loss is compared, and the checksums at 5, 10, ..., 30.
    losses = train_runs.logged_steps(resumed)
    assert set(range(1, train_runs.STEPS + 1)) <= set(losses)
    rows = [json.loads(x) for x in (resumed / "fingerprint" / "checksums.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} >= {5, 10, 15, 20, 25, 30}


def test_two_fresh_runs_are_identical(runs):
    root, cache, straight = runs
    again = root / "again"
    train_runs.train(again, cache)
    report = train_runs.verify(straight, again)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {train_runs.STEPS}" in report.stdout, report.stdout
    header_a = json.loads((straight / "fingerprint" / "header.json").read_text())
    header_b = json.loads((again / "fingerprint" / "header.json").read_text())
    assert header_a["config_hash"] == header_b["config_hash"]
    assert header_a["data_fingerprint"] == header_b["data_fingerprint"]


def test_verify_names_the_step_where_a_perturbed_run_diverges(runs):
    """A different seed changes the data and the init: verify reports step 1 (after the
    config difference, which it allows on request) and exits 1."""
    root, cache, straight = runs
    other = root / "other_seed"
    train_runs.train(other, cache, extra=("--config.seed=1",))
    plain = train_runs.verify(straight, other)
    assert plain.returncode == 1 and "config" in (plain.stdout + plain.stderr).lower()
    report = train_runs.verify(straight, other, "--allow_config_diff")
    assert report.returncode == 1, report.stdout + report.stderr
    assert "first divergent step: 1 " in report.stdout, report.stdout
