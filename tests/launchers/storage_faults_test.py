"""Storage that stutters (issue 56): the standard run "t5" (tests/fixtures/standard_runs.py, 1 process
x 8 devices) trained with its model_dir and task cache in a bucket reached through a fault-injecting
proxy (`cairn.storage.fault_proxy`: 5 % of requests get a 429, a 503, a connection reset mid-body or
a 1 s delay; seeded) in front of the GCS emulator. The run meets an outage from the first request of
its step-8 checkpoint on, longer than the retry budget (`CAIRN_STORAGE_RETRY_S=5`): one line naming
the bucket, the operation and the last good checkpoint (step 4), exit 2. Resumed under the same 5 %
of faults, it ends bit-exact with the standard run on local disk (every loss, batch fingerprint and
parameter checksum: `verify`'s comparison), and the proxy's counts show every kind of fault served.
This process reads the same bucket through the proxy: the cached task's records under faults are
the local cache's, and an outage of its reads is one `StorageUnavailableError` within the budget.

The training runs are forked from one interpreter that imported the train program (`forks.Spawner`,
as gcs_test), on the standard run's 8 devices (their bits are compared)."""

import json
import os
import pathlib
import time

import launch_util
import pytest
import standard_runs

from cairn import storage
from cairn.storage import retries
from cairn.storage.fault_proxy import FAULT_KINDS, FaultProxy
from cairn.storage.testing import GcsEmulator

STEPS = standard_runs.STEPS
TRAIN = "cairn.launchers.train_main"
BUDGET_S = 5.0  # the retry budget of every process here (CAIRN_STORAGE_RETRY_S)
RATE = 0.05
TASK = "shakespeare_span_corruption"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The emulator, the proxy in front of it (no faults while the archive's task cache is copied
    into the bucket, then 5 %), this process pointed at the proxy with the budget, and the
    children's env."""
    tmp = tmp_path_factory.mktemp("stutter")
    standard = standard_runs.unpack(tmp)
    budget = os.environ.get(retries.RETRY_VARIABLE)
    with GcsEmulator() as emu, FaultProxy(emu.url, rate=0.0, seed=56, delay_s=1.0) as proxy:
        proxy.activate()
        retries.set_retry_budget(BUDGET_S)
        try:
            env = proxy.environ({"CAIRN_SHAKESPEARE_DIR": standard.texts, retries.RETRY_VARIABLE: f"{BUDGET_S:g}"})
            bucket = emu.create_bucket("cairn-stutter")
            for path in sorted(pathlib.Path(standard.cache).rglob("*")):
                if path.is_file():
                    storage.copy_file(str(path), f"{bucket}/cache/{path.relative_to(standard.cache)}")
            proxy.set_rate(RATE)
            yield {"tmp": tmp, "standard": standard, "proxy": proxy, "bucket": bucket, "env": env}
        finally:
            if budget is None:
                os.environ.pop(retries.RETRY_VARIABLE, None)
            else:
                os.environ[retries.RETRY_VARIABLE] = budget
            retries.reset_outage()


def test_reading_the_cache_under_faults_and_an_outage(world):
    """The cached task read from the bucket under 5 % faults (ranged GETs on the direct path,
    gcsfs for its metadata) is the local cache, record for record; with every request refused,
    a read gives up within the budget naming the bucket and the operation."""
    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.cached_task import CachedTask

    proxy = world["proxy"]
    before = proxy.counts()
    local = CachedTask(task_dir(str(world["standard"].cache), TASK, "train"))
    remote = CachedTask(task_dir(world["bucket"] + "/cache", TASK, "train"))
    rows = range(local.num_records)
    assert remote.num_records == local.num_records > 10
    assert remote.read(rows) == local.read(rows)
    name = remote.info["shards"][0]["file"]
    shard, local_shard = (f"{task.path}/{name}" for task in (remote, local))
    size = os.path.getsize(local_shard)
    ranges = [(start, min(start + 4096, size)) for start in range(0, size, size // 400 or 1)][:400]
    got = storage.read_ranges([(shard, a, b) for a, b in ranges])
    assert got == storage.read_ranges([(local_shard, a, b) for a, b in ranges])
    served = {k: v - before[k] for k, v in proxy.counts().items()}
    assert served["requests"] >= 400 and sum(served[k] for k in FAULT_KINDS) > 5, served

    proxy.outage(60)
    start = time.monotonic()
    try:
        with pytest.raises(storage.StorageUnavailableError) as raised:
            storage.read_ranges([(shard, 0, 16)])
    finally:
        proxy.end_outage()
        retries.reset_outage()
    seconds = time.monotonic() - start
    assert BUDGET_S * 0.5 < seconds < BUDGET_S + 3, seconds
    error = raised.value
    assert error.bucket == "cairn-stutter" and "reading bytes [0, 16)" in error.operation, error
    assert "bucket 'cairn-stutter' unavailable" in str(error) and "HTTP 503" in str(error)


def test_an_outage_is_one_line_and_the_resume_under_faults_is_bit_exact(world):
    """The run under 5 % of faults meets an outage from its step-8 save on: one line (the bucket,
    the budget, the last good checkpoint), exit 2, no traceback. Resumed under the same faults:
    restored from step 4 and bit-exact with the standard run, every step's loss present; every
    kind of fault was served, at about the rate asked."""
    from cairn.launchers import verify

    proxy = world["proxy"]
    run = world["bucket"] + "/runs/t5"
    argv = standard_runs.overrides(run, world["bucket"] + "/cache", STEPS)
    with launch_util.Spawner(world["env"], preload=("cairn.models", "cairn.trainer", TRAIN)) as spawner:
        proxy.outage(600, after=r"/checkpoints/8\b")  # from step 8's save on, until ended below
        try:
            start = time.monotonic()
            out = spawner.call(TRAIN, argv, timeout=300)
            seconds = time.monotonic() - start
        finally:
            proxy.end_outage()
        assert out.returncode == 2, launch_util.tail(out)
        assert "Traceback" not in out.stderr, launch_util.tail(out)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, launch_util.tail(out)
        line = errors[0]
        assert "bucket 'cairn-stutter' unavailable" in line and "retry budget is 5 s" in line, line
        assert f"the last good checkpoint (step {standard_runs.CHECKPOINT_EVERY}) is kept in {run}" in line, line
        assert proxy.counts()["outage"] > 0

        resumed = spawner.call(TRAIN, argv, timeout=300)
    assert resumed.returncode == 0, launch_util.tail(resumed)
    assert f"restored step {standard_runs.CHECKPOINT_EVERY}" in resumed.stderr, launch_util.tail(resumed)
    assert f"trained to step {STEPS}" in resumed.stdout
    report = verify.compare_runs(world["standard"].run("t5"), run)
    assert report.exit_code == verify.EXIT_IDENTICAL and report.last_step == STEPS, report.text()
    assert report.losses_compared == STEPS and report.checksums_compared and report.batches_compared, report.text()

    counts = proxy.counts()  # reported on stdout, and under Bazel in the target's outputs
    print(f"faults served by the proxy: {counts}; the run with the outage took {seconds:.1f} s")
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if outputs:
        with open(os.path.join(outputs, "faults_served.json"), "w") as f:
            json.dump({**counts, "outage_run_s": round(seconds, 1)}, f)
    assert all(counts[kind] > 0 for kind in FAULT_KINDS), counts
    faulted = sum(counts[kind] for kind in FAULT_KINDS)
    assert 0.02 < faulted / (counts["requests"] - counts["outage"]) < 0.09, counts
