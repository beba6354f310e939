"""`//launchers:supervise`: run one process of a multi-process job and name a lost coordinator.

    python -m cairn.launchers.supervise [--] python -m cairn.launchers.train_main --config=...

When process 0 of a JAX job dies, the coordination service it hosts goes with it, and JAX 0.10.2
aborts every other process within about 0.1 s (SIGABRT, exit 134) with a C++ check-failure stack
of some 20-90 lines. That abort cannot be intercepted inside the process (docs/design.md,
"A lost coordinator"): the client's error callback is the only hook, `jax.distributed` does not
expose it, and passing one to the runtime client directly ends in `std::bad_cast` (it cannot hand
the status to Python); `jax_enable_recoverability` does not change it. So the job's supervisor
does it: this program runs the command as its child, passes stdout through and stderr line by
line, but holds back the JAX runtime's own log lines (those of the coordination service and its
client) for up to `HOLD_S` seconds. If the child then dies of SIGABRT with the coordination
service gone, the held lines are dropped and one line is printed instead (wrapped here),

    error: process 0 of 4 (the coordinator at 10.0.0.2:12345) stopped responding (its
    coordination service is gone); stopping process 2

with exit status 3, as for a lost peer (`cairn.partitioning.peer_watchdog`). Anything else is
passed through unchanged (held lines are released after `HOLD_S`), with the child's exit status.
SIGTERM, SIGINT and SIGHUP are forwarded to the child. The process id, count and coordinator
address come from `$CAIRN_PROCESS_ID`/`$SLURM_PROCID`, `$CAIRN_NUM_PROCESSES`/`$SLURM_NTASKS`
and `$CAIRN_COORDINATOR_ADDRESS`/`$JAX_COORDINATOR_ADDRESS` when set. No JAX import here.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

LOST_PEER_EXIT_CODE = 3  # as cairn.partitioning.peer_watchdog.PEER_LOST_EXIT_CODE
HOLD_S = 2.0
# The JAX runtime's C++ log lines about the coordination service (absl format: "E1207 10:39:54.888670
# 13628 coordination_service_agent.cc:289] ..."), and what follows them when the process aborts.
RUNTIME_LINE = re.compile(
    rb"^[IWEF]\d{4} [\d:.]+\s+\d+ (coordination_service\w*|preemption_\w+|client|distributed\w*)\.(cc|h):\d+\]"
)
FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
SERVICE_GONE = (b"Failed to send RPC to coordination service", b"leader task", b"Socket closed")


def _env(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def lost_coordinator_line(env: Mapping[str, str] | None = None) -> str:
    """The one line for a lost coordinator, with what the environment says about the job."""
    env = os.environ if env is None else env
    count = _env(env, "CAIRN_NUM_PROCESSES", "JAX_NUM_PROCESSES", "SLURM_NTASKS")
    address = _env(env, "CAIRN_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
    me = _env(env, "CAIRN_PROCESS_ID", "JAX_PROCESS_ID", "SLURM_PROCID")
    who = "process 0" + (f" of {count}" if count else "")
    where = f"the coordinator at {address}" if address else "the coordinator"
    stopping = f"stopping process {me}" if me is not None else "stopping"
    return f"error: {who} ({where}) stopped responding (its coordination service is gone); {stopping}"


def is_lost_coordinator(held: Sequence[bytes], returncode: int, env: Mapping[str, str] | None = None) -> bool:
    """Whether a child that ended with `returncode` after printing the `held` runtime lines was
    stopped by JAX because the coordination service (process 0) is gone."""
    env = os.environ if env is None else env
    if returncode not in (-signal.SIGABRT, 128 + signal.SIGABRT):
        return False
    if _env(env, "CAIRN_PROCESS_ID", "JAX_PROCESS_ID", "SLURM_PROCID") == "0":
        return False  # process 0 hosts the service: its own abort is another story
    text = b"".join(held)
    return FATAL in text and any(words in text for words in SERVICE_GONE)


def supervise(command: Sequence[str], hold_s: float = HOLD_S, env: Mapping[str, str] | None = None) -> int:
    """Runs `command` (see the module docstring); returns the exit status to end with."""
    child = subprocess.Popen(list(command), stderr=subprocess.PIPE)
    forwarded = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        forwarded[signum] = signal.signal(signum, lambda s, _f: child.send_signal(s))
    try:
        held = _pump(child, hold_s)
        code = child.wait()
    finally:
        for signum, previous in forwarded.items():
            signal.signal(signum, previous)
    if held and is_lost_coordinator(held, code, env):
        _write(lost_coordinator_line(env).encode() + b"\n")
        return LOST_PEER_EXIT_CODE
    _write(b"".join(held))
    return code if code >= 0 else 128 - code


def _pump(child: subprocess.Popen, hold_s: float) -> list[bytes]:
    """Forwards the child's stderr, holding runtime lines (and all after them) up to `hold_s`;
    returns what is still held at the end of the stream."""
    assert child.stderr is not None
    fd = child.stderr.fileno()
    pending = b""
    held: list[bytes] = []
    since: float | None = None
    while True:
        timeout: float | None = None if since is None else max(0.0, since + hold_s - time.monotonic())
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:  # held long enough without an abort: release
            _write(b"".join(held))
            held, since = [], None
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in (line + b"\n" for line in lines):
            if since is None and RUNTIME_LINE.match(line):
                since = time.monotonic()
            if since is None:
                _write(line)
            else:
                held.append(line)
        if pending and since is None and not pending[:1].isalpha():  # a progress redraw, not a log line
            _write(pending)
            pending = b""
    if pending:
        held.append(pending) if since is not None else _write(pending)
    return held


def _write(data: bytes) -> None:
    while data:
        try:
            data = data[os.write(2, data) :]
        except OSError:
            return


def run() -> None:
    """The program (as the other entry points' `run`): `main()`'s status ends the process."""
    sys.exit(main())


def main(argv: Sequence[str] | None = None) -> int:
    """`supervise(argv)` (the command after an optional `--`); 2 when it cannot be started."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        return supervise(args)
    except FileNotFoundError as e:
        print(f"error: cannot run {args[0]}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    run()
