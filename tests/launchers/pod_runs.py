"""Multi-process runs of the train entry point (`python -m cairn.launchers.train_main`) on
127.0.0.1 for the pod tests: N processes x D virtual CPU devices, the default experiment shrunk
by overrides, one log per process and stream, hard timeouts, and every child's process group
killed at the end (`with Pod(...) as pod:`). With a `spawner` (`pod_runs.spawner`, one for a test
module) the processes are forked from one interpreter that imported the train program and the
libraries it trains with, instead of each starting a new one (about 2 s of CPU each)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import forks
import launch_util
import standard_runs as sr

TIMEOUT_S = 600  # one run on a loaded 2-core machine (about 1 min quiet for 2 processes)


TRAIN = "cairn.launchers.train_main"


def spawner(devices: int, texts: str) -> forks.Spawner:
    """An interpreter that forks the processes of `Pod(..., spawner=...)` runs on `devices` CPU
    devices each, reading `texts`."""
    return forks.Spawner(sr.child_env(texts, devices), preload=("cairn.models", "cairn.trainer", TRAIN))


def overrides(model_dir: Path, cache_dir: Path, steps: int, extra: Sequence[str] = ()) -> list[str]:
    """The standard short run's flags (tests/fixtures/standard_runs.py) for `steps` steps."""
    return sr.overrides(model_dir, cache_dir, steps, extra)


class Pod:
    """`processes` train processes of one job (process i logs to `<log_name>-p<i>.out/.err` next
    to the model_dir; `log_name` defaults to the model_dir's name)."""

    def __init__(
        self,
        model_dir: Path,
        args: list[str],
        processes: int,
        devices: int,
        texts: str,
        log_name: str | None = None,
        log_dir: Path | None = None,
        spawner: forks.Spawner | None = None,
    ):
        """`log_dir` (default: the model_dir's parent) holds the logs; give it (and `log_name`)
        when the model_dir is a URL. `spawner`: made by `pod_runs.spawner(devices, texts)`."""
        self.model_dir, self.processes = model_dir, processes
        name = log_name or model_dir.name
        log_dir = log_dir or model_dir.parent
        self.logs = [(log_dir / f"{name}-p{i}.out", log_dir / f"{name}-p{i}.err") for i in range(processes)]
        env = sr.child_env(texts, devices)
        address = f"127.0.0.1:{sr.free_port()}"
        self.procs = []
        for i, (out, err) in enumerate(self.logs):
            flags = [
                f"--config.multihost.coordinator_address={address}",
                f"--config.multihost.num_processes={processes}",
                f"--config.multihost.process_id={i}",
            ]
            if spawner is not None:  # its interpreter has `env` (the same devices and texts)
                self.procs.append(spawner.popen(TRAIN, [*args, *flags], stdout=out, stderr=err))
                continue
            with open(out, "w") as o, open(err, "w") as e:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", TRAIN, *args, *flags],
                        env=env,
                        stdout=o,
                        stderr=e,
                        cwd=str(launch_util.REPO),
                        start_new_session=True,
                    )
                )
        self.deadline = time.monotonic() + TIMEOUT_S

    def __enter__(self) -> Pod:
        return self

    def __exit__(self, *exc) -> None:
        self.kill(signal.SIGKILL)

    def stderr(self, i: int) -> str:
        return self.logs[i][1].read_text(errors="replace")

    def stdout(self, i: int) -> str:
        return self.logs[i][0].read_text(errors="replace")

    def tails(self, n: int = 2500) -> str:
        return "\n".join(
            f"--- process {i} (rc {p.poll()}) stderr:\n{self.stderr(i)[-n:]}" for i, p in enumerate(self.procs)
        )

    def kill(self, sig: int, which: Sequence[int] | None = None, group: bool = True) -> None:
        """Sends `sig` to the processes `which` (default all) still running: to the process
        group (the process and anything it started), or with `group=False` to the process only."""
        for i in range(self.processes) if which is None else which:
            p = self.procs[i]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig) if group else p.send_signal(sig)
                except ProcessLookupError:
                    pass
            if sig == signal.SIGKILL:
                p.wait()

    def wait_for(self, pattern: str, process: int = 0) -> re.Match:
        """Polls process `process`'s stderr until `pattern` matches; fails if the job ends first."""
        regex = re.compile(pattern)
        while time.monotonic() < self.deadline:
            match = regex.search(self.stderr(process))
            if match:
                return match
            if any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"a process ended before {pattern!r} appeared:\n{self.tails()}")
            time.sleep(0.01)
        raise AssertionError(f"no {pattern!r} within {TIMEOUT_S}s:\n{self.tails()}")

    def wait(self, which: Sequence[int] | None = None) -> list:
        """Waits for the processes `which` (default all); returns their exit statuses. Kills the job
        and fails when the run's deadline passes."""
        codes = []
        for i in range(self.processes) if which is None else which:
            try:
                codes.append(self.procs[i].wait(timeout=max(1.0, self.deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                raise AssertionError(f"the job timed out after {TIMEOUT_S}s:\n{self.tails()}") from None
        return codes

    def finish(self) -> None:
        """Waits for every process and fails unless all exit 0."""
        codes = self.wait()
        assert codes == [0] * self.processes, f"exit statuses {codes}:\n{self.tails()}"


def metric_rows(model_dir: Path) -> list:
    path = model_dir / "summaries" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
