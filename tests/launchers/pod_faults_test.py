"""(d) Preemption and lost processes on 2 processes x 2 CPU devices (127.0.0.1, the train entry
point). SIGTERM to every process, and to one process only: every process saves the same step and
exits 0, and a resumed run ends bit-identical to an uninterrupted one (`verify`, exact). SIGKILL
of one process mid-training: the other stops within `multihost.heartbeat_timeout_seconds` with one
line naming it, exit status 3, no C++ stack trace. Also: only process 0 writes summaries, and
process 1 logs an MFU comparable to process 0's."""

import collections
import re
import signal
import statistics
import time

import launch_util
import pod_runs
import pytest

STEPS = 10
PROCESSES, DEVICES = 2, 2
BOUND_S = 10  # multihost.heartbeat_timeout_seconds of the SIGKILL test
MARGIN_S = 20  # the watchdog's polling and grace, and a loaded machine


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pod_faults")
    return root, launch_util.small_texts(root), root / "cache"


@pytest.fixture(scope="module")
def straight(data):
    """The uninterrupted run; returns its model_dir and each process's stderr."""
    root, texts, cache = data
    model_dir = root / "straight"
    with pod_runs.Pod(model_dir, pod_runs.overrides(model_dir, cache, STEPS), PROCESSES, DEVICES, texts) as pod:
        pod.finish()
        return model_dir, [pod.stderr(i) for i in range(PROCESSES)]


def test_process_0_writes_the_summaries_and_every_process_logs_its_mfu(straight):
    model_dir, stderr = straight
    rows = pod_runs.metric_rows(model_dir)
    counts = collections.Counter((r["task"], r["step"], r["metric"]) for r in rows)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]  # each value once
    losses = sorted(step for (task, step, metric) in counts if task == "train" and metric == "loss")
    assert losses == list(range(1, STEPS + 1))
    mfu = []
    for i, text in enumerate(stderr):
        logged = re.findall(rf"process {i}/{PROCESSES}: train step (\d+): .*?mfu=([0-9.e+-]+)", text)
        assert logged, text[-2000:]
        mfu.append(statistics.median(float(m) for _, m in logged))
    # Each process measures the host's peak on its own devices: the same MFU within noise
    # (process 1 used to probe a device of process 0 and log an MFU thousands of times smaller).
    # Medians over the logged steps, and a wide band: one step's figure varied 2.1x between the
    # processes on a loaded CI machine.
    assert 0.2 <= mfu[1] / mfu[0] <= 5.0, mfu


@pytest.mark.parametrize("who", ["all", "one"])
def test_sigterm_stops_every_process_at_one_saved_step_and_resume_is_bit_exact(data, straight, who):
    root, texts, cache = data
    model_dir = root / f"sigterm_{who}"
    args = pod_runs.overrides(model_dir, cache, STEPS)
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, texts) as pod:
        pod.wait_for(r"train step 3:", process=1)
        pod.kill(signal.SIGTERM, which=None if who == "all" else [1], group=False)
        codes = pod.wait()
        assert codes == [0] * PROCESSES, f"exit statuses {codes}:\n{pod.tails()}"
        stops = [
            re.findall(r"SIGTERM on (this|another) process: saving step (\d+) and stopping", pod.stderr(i))
            for i in range(PROCESSES)
        ]
        assert all(len(s) == 1 for s in stops), (stops, pod.tails())
        saved = {int(s[0][1]) for s in stops}
        assert len(saved) == 1, stops  # every process saved the same step
        step = saved.pop()
        assert 3 <= step < STEPS, step
        if who == "one":
            assert [s[0][0] for s in stops] == ["another", "this"], stops
        assert "(preempted: checkpoint saved)" in pod.stdout(0), pod.stdout(0)
    assert max(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()) == step

    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, texts, log_name=f"{model_dir.name}-resumed") as pod:
        pod.finish()
        assert f"restored step {step} from" in pod.stderr(0), pod.tails()
    report = pod_runs.verify(straight[0], model_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {STEPS}" in report.stdout, report.stdout


def test_sigkill_of_one_process_stops_the_other_within_the_bound(data):
    root, texts, cache = data
    model_dir = root / "sigkill_one"
    args = pod_runs.overrides(model_dir, cache, 200, [f"--config.multihost.heartbeat_timeout_seconds={BOUND_S}"])
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, texts) as pod:
        pod.wait_for(r"train step 2:", process=1)
        killed_at = time.monotonic()
        pod.kill(signal.SIGKILL, which=[1])
        [code] = pod.wait(which=[0])
        elapsed = time.monotonic() - killed_at
        stderr = pod.stderr(0)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 3, f"exit status {code}:\n{stderr[-3000:]}"
    assert re.fullmatch(r"error: process 1 of 2 stopped responding \(no heartbeat for \d+ s\); stopping", lines[-1]), (
        lines[-3:]
    )
    assert elapsed < BOUND_S + MARGIN_S, elapsed
    for trace in ("Check failure", "Traceback", "Fatal Python error", "stack trace"):
        assert trace not in stderr, stderr[-3000:]
