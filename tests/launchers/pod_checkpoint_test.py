"""(c) Preemption and asynchronous checkpoints on 2 processes x 2 CPU devices (127.0.0.1, the train
entry point), as one run: SIGTERM to every process (each saves the same step and exits 0); then,
resumed, saves run in the background on every process while training goes on, and SIGKILL of
every process while a save is being written leaves the previous checkpoint; then resumed to the
end, bit-identical to the uninterrupted standard run of the same layout
(tests/fixtures/standard_runs.py; `verify`, exact), with no torn save left behind."""

import re
import signal

import pod_runs
import standard_runs as sr

PROCESSES, DEVICES = 2, 2


def checkpoints(model_dir):
    return sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_sigterm_all_then_sigkill_all_during_a_save_then_resume_is_bit_exact(tmp_path):
    standard = sr.unpack(tmp_path)
    model_dir = tmp_path / "preempted"
    args = pod_runs.overrides(model_dir, standard.cache, sr.STEPS)

    # 1. SIGTERM to every process: one agreed step saved, exit 0.
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, standard.texts, log_name="sigterm") as pod:
        pod.wait_for(r"train step 2:", process=1)
        pod.kill(signal.SIGTERM, group=False)
        codes = pod.wait()
        assert codes == [0] * PROCESSES, f"exit statuses {codes}:\n{pod.tails()}"
        stops = [
            re.findall(r"SIGTERM on (this|another) process: saving step (\d+) and stopping", pod.stderr(i))
            for i in range(PROCESSES)
        ]
        assert all(len(s) == 1 for s in stops), (stops, pod.tails())
        saved = {int(s[0][1]) for s in stops}
        assert len(saved) == 1, stops
        step = saved.pop()
        assert "(preempted: checkpoint saved)" in pod.stdout(0), pod.stdout(0)
    assert 2 <= step < 8 and checkpoints(model_dir)[-1] == step, (step, checkpoints(model_dir))

    # 2. Resumed: checkpoint 8 is being written in the background on every process when all die.
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, standard.texts, log_name="killed") as pod:
        for i in range(PROCESSES):  # save() has returned on every process...
            pod.wait_for(r"checkpoint at step 8 \(blocked the loop", process=i)
        pod.kill(signal.SIGKILL)  # ...and every process dies while step 8 is being written
        for i in range(PROCESSES):  # every process saved in the background, training on meanwhile
            background = re.findall(r"checkpoint at step (\d+) \(blocked the loop", pod.stderr(i))
            assert background == [str(s) for s in (4, 8) if s > step], (i, background, pod.tails())
    on_disk = checkpoints(model_dir)
    assert 8 not in on_disk and on_disk[-1] == 4, f"the kill should interrupt the save of step 8: {on_disk}"

    # 3. Resumed to the end from step 4: the same bits as the run that never stopped.
    with pod_runs.Pod(model_dir, args, PROCESSES, DEVICES, standard.texts, log_name="resumed") as pod:
        pod.finish()
        assert "restored step 4 from" in pod.stderr(0), pod.tails()
    leftovers = [p.name for p in (model_dir / "checkpoints").iterdir() if not p.name.isdigit()]
    assert leftovers == [], leftovers  # the interrupted save's temporary directory was removed
    report = sr.verify(standard.run("t5_2x2"), model_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
