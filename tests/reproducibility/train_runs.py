"""Runs `python -m cairn.launchers.train_main` (what `bazel run //launchers:train` runs) with the
standard runs' texts, task cache and flags (tests/fixtures/standard_runs.py), in child processes
with hard timeouts: single runs, a run SIGKILLed after a logged step or a checkpoint, and runs
of several processes on 127.0.0.1. Every run is a process forked from an interpreter that
imported the train program and the libraries it trains with (`forks.Spawner`, one per device
count and texts, kept until this process exits), without a new interpreter's start-up and
imports each (about 2 s of CPU)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import forks
import standard_runs as sr

TIMEOUT_S = 600  # one run on a loaded 2-core machine
TRAIN = "cairn.launchers.train_main"
PRELOAD = ("cairn.models", "cairn.trainer")  # what a training run imports after the program


_SPAWNERS: dict[tuple[int, str], forks.Spawner] = {}


def _spawner(devices: int, texts: str) -> forks.Spawner:
    key = (devices, texts)
    if key not in _SPAWNERS:
        env = sr.child_env(texts, devices)
        _SPAWNERS[key] = forks.Spawner(env, preload=(*PRELOAD, TRAIN))
    return _SPAWNERS[key]


@atexit.register
def _close_spawners() -> None:
    for spawner in _SPAWNERS.values():
        spawner.close()


def start(args: Sequence[str], texts: str, devices: int = 8, log: Path | None = None) -> forks.Spawned:
    """The train program with `args`, started (stdout and stderr to `log`)."""
    out = str(log) if log else os.devnull
    return _spawner(devices, texts).popen(TRAIN, list(args), stdout=out, stderr=out)


def tail(log: Path | None, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log and log.exists() else ""


def finish(proc: forks.Spawned, log: Path | None = None, timeout: float = TIMEOUT_S) -> None:
    """Waits for `proc`; kills its process group and fails with the log's tail on timeout or error."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"train timed out after {timeout}s:\n{tail(log)}") from None
    assert code == 0, f"train exited {code}:\n{tail(log)}"


def train(
    model_dir: Path, std: sr.Standard, extra: Sequence[str] = (), devices: int = 8, steps: int = sr.STEPS
) -> Path:
    """One process to the end; returns its log."""
    log = model_dir.parent / f"{model_dir.name}.log"
    finish(start(sr.overrides(model_dir, std.cache, steps, extra), std.texts, devices, log), log)
    return log


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


def train_and_kill(model_dir: Path, std: sr.Standard, after_step: int, after_checkpoint: int | None = None) -> int:
    """Starts a run and SIGKILLs it as soon as a loss of step >= `after_step` is logged (and, if
    given, checkpoint `after_checkpoint` is complete: its manifest exists); returns the last
    logged step at the kill."""
    manifest = model_dir / "manifests" / f"{after_checkpoint}.json"
    log = model_dir.parent / f"{model_dir.name}-killed.log"
    proc = start(sr.overrides(model_dir, std.cache), std.texts, 8, log)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            steps = logged_steps(model_dir)
            if steps and max(steps) >= after_step and (after_checkpoint is None or manifest.exists()):
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


def start_group(
    model_dir: Path, std: sr.Standard, processes: int, devices_each: int, extra: Sequence[str] = (), tag: str = ""
) -> tuple[list, list]:
    """Starts one run as `processes` processes x `devices_each` CPU devices (one process: no
    coordinator); returns `(procs, logs)`."""
    address = f"127.0.0.1:{sr.free_port()}"
    logs = [model_dir.parent / f"{model_dir.name}{tag}-p{i}.log" for i in range(processes)]
    procs = []
    for i in range(processes):
        flags = sr.multihost_flags(address, processes, i) if processes > 1 else []
        procs.append(start(sr.overrides(model_dir, std.cache, extra=extra) + flags, std.texts, devices_each, logs[i]))
    return procs, logs


def train_group(
    model_dir: Path, std: sr.Standard, processes: int, devices_each: int, extra: Sequence[str] = ()
) -> list[Path]:
    """One run as `processes` processes x `devices_each` CPU devices to the end; returns their logs."""
    procs, logs = start_group(model_dir, std, processes, devices_each, extra)
    finish_all(procs, logs)
    return logs


def train_group_from_environment(
    model_dir: Path, std: sr.Standard, processes: int, devices_each: int, extra: Sequence[str] = ()
) -> list[tuple[Path, Path]]:
    """One run as `processes` processes x `devices_each` CPU devices started the way a cluster
    scheduler does (`CAIRN_COORDINATOR_ADDRESS`, `CAIRN_NUM_PROCESSES` and `CAIRN_PROCESS_ID` in
    the environment, no multihost flags), to the end; returns each process's (stdout, stderr)."""
    shared = {"CAIRN_COORDINATOR_ADDRESS": f"127.0.0.1:{sr.free_port()}", "CAIRN_NUM_PROCESSES": str(processes)}
    logs = [
        (model_dir.parent / f"{model_dir.name}-env-p{i}.out", model_dir.parent / f"{model_dir.name}-env-p{i}.err")
        for i in range(processes)
    ]
    args = sr.overrides(model_dir, std.cache, extra=extra)
    spawner = _spawner(devices_each, std.texts)
    procs = [
        spawner.popen(TRAIN, args, stdout=out, stderr=err, env={**shared, "CAIRN_PROCESS_ID": str(i)})
        for i, (out, err) in enumerate(logs)
    ]
    finish_all(procs, [err for _, err in logs])
    return logs


def finish_all(procs: list, logs: Sequence[Path]) -> None:
    """`finish` each process of a group with its log, the group killed if one fails or hangs."""
    try:
        for p, log in zip(procs, logs, strict=True):
            finish(p, log)
    finally:
        kill_all(procs)


def kill_all(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


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


def check_matches_one_process(one: Path, many: Path, processes: int) -> None:
    """`many` (a run on `processes` processes) trained what `one` (1 process, same mesh) trained:
    the same config hash, data fingerprint, mesh and devices; the same global batch at every
    fingerprinted step (bitwise); losses and parameter sums within rtol 1e-5 (`verify`)."""
    fingerprinted = list(range(sr.FINGERPRINT_EVERY, sr.STEPS + 1, sr.FINGERPRINT_EVERY))
    h1, hn = sr.header(one), sr.header(many)
    assert (h1["process_count"], hn["process_count"]) == (1, processes)
    assert h1["device_count"] == hn["device_count"] == 8
    assert h1["mesh"] == hn["mesh"]
    # The multihost section and model_dir are outside the hash; the data is a function of (seed, step).
    assert h1["config_hash"] == hn["config_hash"] and h1["data_fingerprint"] == hn["data_fingerprint"]
    b1, bn = sr.batch_fingerprints(one), sr.batch_fingerprints(many)
    assert sorted(b1) == sorted(bn) == fingerprinted
    assert b1 == bn  # the same global rows at every step
    assert len(set(b1.values())) == len(fingerprinted)
    report = sr.verify(one, many, "--rtol=1e-5")
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"identical through step {sr.STEPS}" in report.stdout, report.stdout
    assert f"{len(fingerprinted)} batch fingerprints compared" in report.stdout, report.stdout
    assert set(range(1, sr.STEPS + 1)) <= set(logged_steps(many))
