"""Bad input on several processes (train entry point, processes on 127.0.0.1): a coordinator
that never answers, processes started with different configs, one host whose task data does
not match. Each ends every process with exit status 2 and one line, never a hang or a C++
stack trace. The processes of every job are forks of one interpreter that imported the train
program (the module's `spawner`: one interpreter for the three jobs), started together: each its
own exit status and output."""

import socket
import subprocess
import time

import launch_util
import pytest

TIMEOUT_S = 300
TRAIN = "cairn.launchers.train_main"


@pytest.fixture(scope="module")
def spawner():
    env = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    with launch_util.Spawner(env, preload=(TRAIN,)) as s:
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(spawner, tmp, args, port, child_envs, timeout=TIMEOUT_S):
    """The train program with `args` as the processes of one job (one per entry of
    `child_envs`: its variables), forked together by `spawner`; their CompletedProcess, with
    `seconds` (from the start to the process's exit, as seen here)."""
    n = len(child_envs)
    start = time.monotonic()
    procs, logs = [], []
    for i in range(n):
        argv = [
            *args[i],
            f"--config.multihost.coordinator_address=127.0.0.1:{port}",
            f"--config.multihost.num_processes={max(n, 2)}",
            f"--config.multihost.process_id={i if n > 1 else 1}",
        ]
        logs.append((tmp / f"job{port}-p{i}.out", tmp / f"job{port}-p{i}.err"))
        procs.append(spawner.popen(TRAIN, argv, *logs[-1], env=child_envs[i]))
    done = []
    for p, (out, err) in zip(procs, logs):
        try:
            p.wait(max(1.0, start + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"the job did not end within {timeout} s: {err.read_text()[-3000:]}") from None
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text()))
        done[-1].seconds = time.monotonic() - start
    return done


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "Check failure" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.fixture
def base(tmp_path):
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp_path)}
    args = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={tmp_path / 'run'}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
        "--config.num_train_steps=2",
        "--config.data.batch_size=8",
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        "--config.multihost.initialization_timeout_seconds=20",
    ]
    return args, env


def test_coordinator_never_answers(spawner, base, tmp_path):
    """Process 1 of 2, alone: nothing listens at the coordinator's port."""
    args, env = base
    port = free_port()  # nothing listens there
    (proc,) = job(spawner, tmp_path, [args + ["--config.multihost.initialization_timeout_seconds=5"]], port, [env])
    elapsed = proc.seconds
    line = error_line(proc.stderr)
    assert f"process 1 of 2 could not join the job at coordinator 127.0.0.1:{port}" in line, line
    assert "multihost.initialization_timeout_seconds" in line
    assert elapsed < 60, elapsed


def test_processes_with_different_configs(spawner, base, tmp_path):
    args, env = base
    port = free_port()
    procs = job(spawner, tmp_path, [args, args + ["--config.data.batch_size=16", "--config.seed=3"]], port, [env, env])
    for p in procs:
        assert p.returncode == 2, p.stderr[-3000:]
        line = error_line(p.stderr)
        assert "started with different configs: process 1 differs from process 0 in data.batch_size, seed" in line


def test_one_host_with_other_task_data(spawner, base, tmp_path):
    # Process 1 reads other source texts than those cached: its reader refuses the cache with
    # a named error; process 0 stops too, naming process 1, instead of waiting in the first step.
    args, env = base
    other = tmp_path / "other"
    other.mkdir()
    launch_util.small_texts(other)
    (other / "texts" / "sonnets_gut.txt").write_text("Other words entirely.\n" * 50, encoding="utf-8")
    port = free_port()
    procs = job(spawner, tmp_path, [args, args], port, [env, {"CAIRN_SHAKESPEARE_DIR": str(other / "texts")}])
    assert [p.returncode for p in procs] == [2, 2], [p.stderr[-2000:] for p in procs]
    assert "process(es) [1] of 2 failed while opening the task cache" in error_line(procs[0].stderr)
    assert "does not match" in error_line(procs[1].stderr) or "changed" in error_line(procs[1].stderr)
