"""Preemption, asynchronous checkpoints and lost processes on 2 processes x 2 CPU devices
(127.0.0.1, the train entry point), as one run that meets them in turn: (c) SIGTERM to every
process (each saves the same step and exits 0); then, resumed, saves run in the background on
every process while training goes on, and SIGKILL of one process while a save is being written:
the other stops within `multihost.heartbeat_timeout_seconds` with one line naming it (exit
status 3, no C++ stack trace), and the interrupted save leaves the previous checkpoint; (d)
then, resumed, SIGTERM to one process (every process saves the same step and exits 0); then
resumed to the end, bit-identical to the uninterrupted standard run of the same layout
(tests/fixtures/standard_runs.py; `verify`, exact), with no torn save left behind. (One run
through four process groups: each stage's processes cost their start-up, and the final resume
and comparison are shared; the eight processes are forked from one interpreter that imported the
train program, `pod_runs.spawner`. Every process SIGKILLed during a save, then resumed bit-exact:
gcs_test's bucket run.) Also, from that
standard run: only process 0 writes summaries, and process 1 logs a token rate comparable to process
0's."""

import collections
import re
import signal
import statistics
import time

import pod_runs
import pytest
import standard_runs as sr

PROCESSES, DEVICES = 2, 2
BOUND_S = 10  # multihost.heartbeat_timeout_seconds
MARGIN_S = 20  # the watchdog's polling and grace, and a loaded machine


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    return sr.unpack(tmp_path_factory.mktemp("pod_faults"))


@pytest.fixture(scope="module")
def spawner(standard):
    """The pods' processes are forked from one interpreter that imported the train program
    (`pod_runs.spawner`): ten processes, one set of imports."""
    with pod_runs.spawner(DEVICES, standard.texts) as s:
        yield s


def test_process_0_writes_the_summaries_and_every_process_logs_its_rates(standard):
    rows = pod_runs.metric_rows(standard.run("t5_2x2"))
    counts = collections.Counter((r["task"], r["step"], r["metric"]) for r in rows)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]  # each value once
    losses = sorted(step for (task, step, metric) in counts if task == "train" and metric == "loss")
    assert losses == list(range(1, sr.STEPS + 1))
    assert not any(metric == "mfu" for (_, _, metric) in counts)  # no peak is known on CPU: no MFU
    rates = []
    for i in range(PROCESSES):
        text = standard.log("t5_2x2", i)
        logged = re.findall(rf"process {i}/{PROCESSES}: train step (\d+): .*?tokens_per_second=([0-9.e+-]+)", text)
        assert logged, text[-2000:]
        rates.append(statistics.median(float(m) for _, m in logged))
    # Each process counts the global batch: the same rate within noise. Medians over the logged
    # steps, and a wide band: one step's figure varied 2.1x between the processes on a loaded CI
    # machine.
    assert 0.2 <= rates[1] / rates[0] <= 5.0, rates


def checkpoints(model_dir):
    return sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())


def agreed_stop(pod):
    """The step every process saved on SIGTERM (asserted the same on each), and who got the
    signal as each process says it ("this" or "another")."""
    codes = pod.wait()
    assert codes == [0] * PROCESSES, f"exit statuses {codes}:\n{pod.tails()}"
    stops = [
        re.findall(r"SIGTERM on (this|another) process: saving step (\d+) and stopping", pod.stderr(i))
        for i in range(PROCESSES)
    ]
    assert all(len(s) == 1 for s in stops), (stops, pod.tails())
    saved = {int(s[0][1]) for s in stops}
    assert len(saved) == 1, stops  # every process saved the same step
    assert "(preempted: checkpoint saved)" in pod.stdout(0), pod.stdout(0)
    return saved.pop(), [s[0][0] for s in stops]


def test_sigterm_to_one_then_sigkill_of_one_then_resume_is_bit_exact(standard, spawner, tmp_path):
    """The run of the module docstring: SIGTERM to all, SIGKILL of one during a background save
    (the other stops within the bound), SIGTERM to one, resumed to the end."""
    model_dir = tmp_path / "faults"
    # --verbose: process 1 logs its steps and saves too (the test times its signals by them; by
    # default only process 0 speaks)
    args = pod_runs.overrides(
        model_dir, standard.cache, sr.STEPS, [f"--config.multihost.heartbeat_timeout_seconds={BOUND_S}", "--verbose"]
    )
    # The SIGTERM stages time their signals by process 1's per-step log lines: a log every step
    # there (a logging cadence, which a resume may change). The SIGKILL stage and the final resume
    # run at the experiment's own log_every (5), as users do: rows between log steps must survive.
    timed = [*args, "--config.trainer.log_every=1"]

    # 1. SIGTERM to every process: one agreed step saved, exit 0.
    with pod_runs.Pod(
        model_dir, timed, PROCESSES, DEVICES, standard.texts, log_name="sigterm_all", spawner=spawner
    ) as pod:
        pod.wait_for(r"train step 2:", process=1)
        pod.kill(signal.SIGTERM, group=False)
        step, _ = agreed_stop(pod)
    assert 2 <= step < 8 and checkpoints(model_dir)[-1] == step, (step, checkpoints(model_dir))

    # 2. Resumed: checkpoint 8 is being written in the background on every process when process 1
    # is SIGKILLed; process 0 stops within the bound, one line, exit 3, and step 8 is never saved.
    with pod_runs.Pod(
        model_dir, args, PROCESSES, DEVICES, standard.texts, log_name="sigkill_one", spawner=spawner
    ) as pod:
        for i in range(PROCESSES):  # save() has returned on every process...
            pod.wait_for(r"checkpoint at step 8 \(blocked the loop", process=i)
        assert f"restored step {step} from" in pod.stderr(0), pod.tails()
        killed_at = time.monotonic()
        pod.kill(signal.SIGKILL, which=[1])  # ...and process 1 dies while step 8 is being written
        [code] = pod.wait(which=[0])
        elapsed = time.monotonic() - killed_at
        for i in range(PROCESSES):  # every process saved in the background, training on meanwhile
            background = re.findall(r"checkpoint at step (\d+) \(blocked the loop", pod.stderr(i))
            assert background == [str(s) for s in (4, 8) if s > step], (i, background, pod.tails())
        stderr = pod.stderr(0)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 3, f"exit status {code}:\n{stderr[-3000:]}"
    assert re.fullmatch(r"error: process 1 of 2 stopped responding \(no heartbeat for \d+ s\); stopping", lines[-1]), (
        lines[-3:]
    )
    assert elapsed < BOUND_S + MARGIN_S, elapsed
    for trace in ("Check failure", "Traceback", "Fatal Python error", "stack trace"):
        assert trace not in stderr, stderr[-3000:]
    on_disk = checkpoints(model_dir)
    assert 8 not in on_disk and on_disk[-1] == 4, f"the kill should interrupt the save of step 8: {on_disk}"

    # 3. Resumed from step 4, then SIGTERM to process 1 only: both save one agreed step, exit 0.
    with pod_runs.Pod(
        model_dir, timed, PROCESSES, DEVICES, standard.texts, log_name="sigterm_one", spawner=spawner
    ) as pod:
        pod.wait_for(r"train step 5:", process=1)
        assert "restored step 4 from" in pod.stderr(0), pod.tails()
        pod.kill(signal.SIGTERM, which=[1], group=False)
        step, who = agreed_stop(pod)
    assert who == ["another", "this"], who
    assert 5 <= step < sr.STEPS and checkpoints(model_dir)[-1] == step, (step, checkpoints(model_dir))

    # 4. Resumed to the end: the same bits as the run that never stopped, no torn save left.
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, standard.texts, log_name="resumed", spawner=spawner) as pod:
        pod.finish()
        assert f"restored step {step} from" in pod.stderr(0), pod.tails()
    leftovers = [p.name for p in (model_dir / "checkpoints").iterdir() if not p.name.isdigit()]
    assert leftovers == [], leftovers  # the interrupted save's temporary directories were removed
    report = sr.verify(standard.run("t5_2x2"), model_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
