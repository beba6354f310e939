"""(c) Asynchronous checkpoints on 4 processes x 2 CPU devices (127.0.0.1, the train entry point):
saves run in the background on every process while training goes on; SIGKILL of every process
during a save, then a resume, ends bit-identical to an uninterrupted run (`verify`, exact)."""

import re
import signal

import launch_util
import pod_runs

STEPS = 12  # checkpoints at 4, 8, 12
PROCESSES, DEVICES = 4, 2


def test_sigkill_of_every_process_during_a_save_then_resume_is_bit_exact(tmp_path):
    texts = launch_util.small_texts(tmp_path)
    cache = tmp_path / "cache"
    straight = tmp_path / "straight"
    with pod_runs.Pod(straight, pod_runs.overrides(straight, cache, STEPS), PROCESSES, DEVICES, texts) as pod:
        pod.finish()
        for i in range(PROCESSES):  # every process saved every checkpoint, in the background
            saved = re.findall(r"checkpoint at step (\d+) \(blocked the loop", pod.stderr(i))
            assert saved == ["4", "8", "12"], (i, saved)

    killed = tmp_path / "killed"
    args = pod_runs.overrides(killed, cache, STEPS)
    with pod_runs.Pod(killed, args, PROCESSES, DEVICES, texts) as pod:
        pod.wait_for(r"checkpoint at step 8 \(blocked the loop", process=0)  # save() has returned...
        pod.kill(signal.SIGKILL)  # ...and every process dies while step 8 is being written
    on_disk = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert on_disk == [4], f"the kill should interrupt the save of step 8; checkpoints on disk: {on_disk}"

    with pod_runs.Pod(killed, args, PROCESSES, DEVICES, texts, log_name="resumed") as pod:
        pod.finish()
        assert "restored step 4 from" in pod.stderr(0), pod.tails()
    leftovers = [p.name for p in (killed / "checkpoints").iterdir() if not p.name.isdigit()]
    assert leftovers == [], leftovers  # the interrupted save's temporary directory was removed
    report = pod_runs.verify(straight, killed)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {STEPS}" in report.stdout, report.stdout
