"""Runs train_worker.py in a child process (its own process group) that is always killed on
the way out."""

import contextlib
import os
import signal
import subprocess
import sys

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_worker.py")


@contextlib.contextmanager
def worker(*args):
    proc = subprocess.Popen(
        [sys.executable, WORKER, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
        start_new_session=True,  # its own process group: killed whole below
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stdout:
            proc.stdout.close()


def run_worker(*args, timeout=240) -> str:
    """Runs to completion; returns the output; fails the test on a non-zero exit."""
    with worker(*args) as proc:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker {args} exited {proc.returncode}:\n{out[-4000:]}"
        return out


def wait_for_line(proc, text: str, timeout: float) -> list:
    """Reads the child's lines until one contains `text`; returns the lines read."""
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        if sel.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if text in line:
                return lines
    raise AssertionError(f"worker did not print {text!r} within {timeout}s:\n{''.join(lines)[-4000:]}")
