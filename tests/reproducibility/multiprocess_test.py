"""(c) 1 process x 8 devices against 2 processes x 4 devices (coordinator on 127.0.0.1): the
same global batches and losses within 1e-5 relative, checked by `//launchers:verify`."""

import json

import train_runs


def test_two_processes_match_one(tmp_path):
    cache = tmp_path / "cache"
    one = tmp_path / "one_process"
    two = tmp_path / "two_processes"
    train_runs.train(one, cache)
    train_runs.train_multiprocess(two, cache)
    h1 = json.loads((one / "fingerprint" / "header.json").read_text())
    h2 = json.loads((two / "fingerprint" / "header.json").read_text())
    assert (h1["process_count"], h2["process_count"]) == (1, 2)
    assert h1["device_count"] == h2["device_count"] == 8
    # Same config (the multihost section is outside the hash) and the same data: the global
    # batch at every step is a function of (seed, step) only.
    assert h1["config_hash"] == h2["config_hash"]
    assert h1["data_fingerprint"] == h2["data_fingerprint"]
    report = train_runs.verify(one, two, "--rtol=1e-5")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {train_runs.STEPS}" in report.stdout, report.stdout
    assert set(range(1, train_runs.STEPS + 1)) <= set(train_runs.logged_steps(two))
