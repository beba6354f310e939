"""Runs `python -m cairn.launchers.train_main` (what `bazel run //launchers:train` runs) on the
default experiment, shrunk to a short run, in child processes with hard timeouts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "launchers" / "configs" / "shakespeare_t5_tiny.py"
STEPS = 30
TIMEOUT_S = 600


def overrides(model_dir: Path, cache_dir: Path, steps: int = STEPS) -> list[str]:
    """A 30-step run: checkpoints every 5 steps, a checksum every 5, no post-training work."""
    return [
        f"--config={CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.trainer.checkpoint_every=5",
        "--config.trainer.keep_checkpoints=2",
        "--config.trainer.log_every=5",
        "--config.fingerprint_every=5",
        "--config.post_training.final_eval=False",
        "--config.post_training.num_samples=0",
        "--config.trainer.tensorboard=False",
    ]


def env(devices: int = 8) -> dict:
    e = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    e.pop("BUILD_WORKING_DIRECTORY", None)
    return e


def start(args: list[str], devices: int = 8, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "cairn.launchers.train_main", *args],
        env=env(devices),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, log: Path | None = None, timeout: float = TIMEOUT_S) -> None:
    """Waits for `proc`; kills its process group and fails with the log's tail on timeout or error."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"train timed out after {timeout}s:\n{tail(log)}") from None
    assert code == 0, f"train exited {code}:\n{tail(log)}"


def tail(log: Path | None, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log and log.exists() else ""


def train(model_dir: Path, cache_dir: Path, extra: tuple = (), devices: int = 8, steps: int = STEPS) -> None:
    log = model_dir.parent / f"{model_dir.name}.log"
    finish(start(overrides(model_dir, cache_dir, steps) + list(extra), devices, log), log)


def logged_steps(model_dir: Path) -> list[int]:
    """Steps with a train loss in `summaries/metrics.jsonl` so far."""
    path = model_dir / "summaries" / "metrics.jsonl"
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("task") == "train" and row.get("metric") == "loss":
                steps.append(int(row["step"]))
    return steps


def train_and_kill(model_dir: Path, cache_dir: Path, after_step: int) -> int:
    """Starts a run and SIGKILLs it as soon as a loss of step >= `after_step` is logged;
    returns the last logged step at the kill."""
    log = model_dir.parent / f"{model_dir.name}-killed.log"
    proc = start(overrides(model_dir, cache_dir), 8, log)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            steps = logged_steps(model_dir)
            if steps and max(steps) >= after_step:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return max(steps)
            if proc.poll() is not None:
                raise AssertionError(f"train ended ({proc.returncode}) before step {after_step}:\n{tail(log)}")
            time.sleep(0.02)
        raise AssertionError(f"no step {after_step} within {TIMEOUT_S}s:\n{tail(log)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_multiprocess(
    model_dir: Path,
    cache_dir: Path,
    processes: int = 2,
    devices_each: int = 4,
    extra: tuple = (),
    steps: int = STEPS,
    tag: str = "",
) -> tuple[list, list]:
    """Starts one run as `processes` processes x `devices_each` CPU devices, coordinator on
    127.0.0.1; returns `(procs, logs)`."""
    address = f"127.0.0.1:{free_port()}"
    logs = [model_dir.parent / f"{model_dir.name}{tag}-p{i}.log" for i in range(processes)]
    procs = [
        start(
            overrides(model_dir, cache_dir, steps)
            + list(extra)
            + [
                f"--config.multihost.coordinator_address={address}",
                f"--config.multihost.num_processes={processes}",
                f"--config.multihost.process_id={i}",
            ],
            devices_each,
            logs[i],
        )
        for i in range(processes)
    ]
    return procs, logs


def kill_all(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def train_multiprocess(
    model_dir: Path, cache_dir: Path, processes: int = 2, devices_each: int = 4, extra: tuple = (), steps: int = STEPS
) -> None:
    """One run as `processes` processes x `devices_each` CPU devices, coordinator on 127.0.0.1."""
    procs, logs = start_multiprocess(model_dir, cache_dir, processes, devices_each, extra, steps)
    try:
        for p, log in zip(procs, logs):
            finish(p, log)
    finally:
        kill_all(procs)


def kill_after_checkpoint(model_dir: Path, procs: list, logs: list, step: int) -> None:
    """SIGKILLs every process of a run as soon as its checkpoint at `step` is complete (its
    manifest exists)."""
    manifest = model_dir / "manifests" / f"{step}.json"
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if manifest.exists():
                return
            for p, log in zip(procs, logs):
                if p.poll() is not None:
                    raise AssertionError(f"train ended ({p.returncode}) before checkpoint {step}:\n{tail(log)}")
            time.sleep(0.02)
        raise AssertionError(f"no checkpoint {step} within {TIMEOUT_S}s:\n{tail(logs[0])}")
    finally:
        kill_all(procs)


def verify(a: Path, b: Path, *flags: str) -> subprocess.CompletedProcess:
    """`//launchers:verify` (its module) on two run directories."""
    return subprocess.run(
        [sys.executable, "-m", "cairn.launchers.verify", f"--run_a={a}", f"--run_b={b}", *flags],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
