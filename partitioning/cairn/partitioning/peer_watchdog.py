"""A multi-process job whose peer dies stops within a bound, with one line naming the peer.

Without it, a process killed mid-step (SIGKILL, a lost host) leaves the others waiting in a
collective or in the distributed runtime until JAX's coordination service notices the missing
heartbeats and aborts every process with SIGABRT and a C++ stack trace.

Every process publishes a counter in the JAX distributed client's key-value store every
`interval_s`. Process 0 (which hosts the coordination service) reads them all; a peer whose
counter has not moved for `timeout_s` is lost. Process 0 then publishes the verdict under one key,
which the other processes poll; each prints

    error: process 1 of 4 stopped responding (no heartbeat for 10 s); stopping

and exits with status 3. Process 0 exits last (the coordination service ends with it): once the
others have said they are stopping, or after a short grace period. JAX's own heartbeat timeout
must be longer than `timeout_s` (`initialize_distributed` sets it) so that this fires first.

Not covered: when process 0 itself dies, the coordination service goes with it and JAX aborts the
other processes at once (SIGABRT), which no callback of this process can intercept; the launchers'
supervisor (`cairn.launchers.supervise`) turns that into one line and exit 3.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

log = logging.getLogger(__name__)

HEARTBEAT_DIR = "cairn/heartbeat/"
STOPPING_DIR = "cairn/stopping/"
DONE_DIR = "cairn/done/"
VERDICT_KEY = "cairn/lost_processes"
#: Exit status of a process stopped because a peer stopped responding.
PEER_LOST_EXIT_CODE = 3


def jax_heartbeat_timeout(timeout_s: float) -> int:
    """JAX's heartbeat timeout to pair with a watchdog bound of `timeout_s`: late enough that the
    watchdog (which may need `timeout_s` plus two polling intervals) always decides first."""
    return int(3 * timeout_s) + 10


class PeerWatchdog:
    """Watches the liveness of the other processes of a job through `client` (a JAX
    `DistributedRuntimeClient`, or anything with its `key_value_set`, `key_value_dir_get` and
    `key_value_try_get`). `tick()` does one round; `start()` runs rounds in a daemon thread.

    `exit_fn(status)` ends the process (default `os._exit`); `stream` receives the line (default:
    file descriptor 2 directly, which needs no Python lock); `clock` gives seconds."""

    def __init__(
        self,
        client: Any,
        process_id: int,
        num_processes: int,
        timeout_s: float,
        interval_s: float | None = None,
        *,
        grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        exit_fn: Callable[[int], Any] = os._exit,
        stream: TextIO | None = None,
    ):
        if not timeout_s > 0:
            raise ValueError(f"heartbeat timeout must be > 0 seconds, got {timeout_s}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id {process_id} is not in [0, {num_processes})")
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout_s = float(timeout_s)
        self.interval_s = float(interval_s) if interval_s else max(0.05, min(1.0, self.timeout_s / 10))
        self.grace_s = float(grace_s) if grace_s is not None else 3 * self.interval_s + 2.0
        self._clock, self._exit, self._stream = clock, exit_fn, stream
        self._count = 0
        self._start = clock()
        self._seen: dict[int, str] = {}
        self._moved: dict[int, float] = {}  # peer -> clock() when its counter last changed
        self._blind = False  # the last key-value read failed
        self._stopped = threading.Event()
        self.decided = threading.Event()  # set once a lost peer is named (just before exiting)
        self.message: str | None = None
        self._thread: threading.Thread | None = None

    # -- one round ---------------------------------------------------------------------------
    def tick(self) -> str | None:
        """Publishes this process's heartbeat and looks for lost peers; on a verdict, prints the
        line and calls `exit_fn`. Returns the line when it decided (exit_fn returned), else None.
        Key-value errors are ignored: the round tells nothing then."""
        self._count += 1
        self._try(
            self.client.key_value_set, f"{HEARTBEAT_DIR}{self.process_id}", str(self._count), allow_overwrite=True
        )
        if self.process_id == 0:
            verdict = self._judge()
            if verdict is not None:
                self._try(self.client.key_value_set, VERDICT_KEY, json.dumps(verdict), allow_overwrite=True)
                self._await_others(verdict["lost"])
        else:
            value = self._try(self.client.key_value_try_get, VERDICT_KEY)
            verdict = json.loads(value) if value else None
            if verdict is not None:
                self._try(self.client.key_value_set, f"{STOPPING_DIR}{self.process_id}", "1", allow_overwrite=True)
        if verdict is None:
            return None
        return self._stop_process(verdict)

    def _try(self, fn: Callable, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            return None

    def _judge(self) -> dict | None:
        now = self._clock()
        entries = self._try(self.client.key_value_dir_get, HEARTBEAT_DIR)
        if entries is None:  # no reading this round; after it, silences count from the next reading
            self._blind = True
            return None
        if self._blind:
            self._moved = {p: now for p in range(self.num_processes)}
            self._blind = False
        for key, value in entries:
            try:
                peer = int(key.rstrip("/").rsplit("/", 1)[-1])
            except ValueError:
                continue
            if self._seen.get(peer) != value:
                self._seen[peer], self._moved[peer] = value, now
        done = set()
        for key, _ in self._try(self.client.key_value_dir_get, DONE_DIR) or []:
            try:
                done.add(int(key.rstrip("/").rsplit("/", 1)[-1]))
            except ValueError:
                continue
        silent = {p: now - self._moved.get(p, self._start) for p in range(1, self.num_processes) if p not in done}
        lost = sorted(p for p, s in silent.items() if s > self.timeout_s)
        if not lost:
            return None
        return {"lost": lost, "silent_s": round(max(silent[p] for p in lost), 1)}

    def _await_others(self, lost: list) -> None:
        """Process 0: waits (at most `grace_s`) until every other survivor has said it is stopping."""
        others = self.num_processes - 1 - len(lost)
        deadline = self._clock() + self.grace_s
        while others > 0 and self._clock() < deadline:
            stopping = self._try(self.client.key_value_dir_get, STOPPING_DIR) or []
            if len(stopping) >= others:
                return
            time.sleep(min(self.interval_s, 0.1))

    def _stop_process(self, verdict: dict) -> str:
        lost = verdict["lost"]
        who = f"process {lost[0]}" if len(lost) == 1 else "processes " + ", ".join(str(p) for p in lost)
        verb = "stopped" if len(lost) == 1 else "all stopped"
        self.message = (
            f"error: {who} of {self.num_processes} {verb} responding (no heartbeat for "
            f"{verdict['silent_s']:.0f} s); stopping"
        )
        self._write(self.message + "\n")
        self.decided.set()
        run_stop_hooks()
        self._exit(PEER_LOST_EXIT_CODE)
        return self.message

    def _write(self, text: str) -> None:
        if self._stream is not None:
            self._stream.write(text)
            self._stream.flush()
            return
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os.write(2, text.encode())

    # -- the thread --------------------------------------------------------------------------
    def start(self) -> PeerWatchdog:
        self._start = self._clock()
        self._thread = threading.Thread(target=self._run, name="cairn-peer-watchdog", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self.tick() is not None:
                return
            self._stopped.wait(self.interval_s)

    def stop(self) -> None:
        """Stops watching and says so: the thread is joined (so no round is inside a call into
        the distributed client while the interpreter shuts down, which aborts the process), and
        this process is marked done, so that peers still running do not count it as lost."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.grace_s + 2 * self.interval_s + 5)
        self._try(self.client.key_value_set, f"{DONE_DIR}{self.process_id}", "1", allow_overwrite=True)

    def wait_for_verdict(self, seconds: float | None = None) -> bool:
        """Blocks until a lost peer has been named (the process normally ends then) or `seconds`
        pass (default: long enough for a peer that died just now to be named). True if named."""
        if seconds is None:
            seconds = self.timeout_s + 3 * self.interval_s + self.grace_s
        return self.decided.wait(seconds)


_ACTIVE: PeerWatchdog | None = None
_STOP_HOOKS: list[Callable[[], Any]] = []


def on_stop(hook: Callable[[], Any]) -> Callable[[], None]:
    """Registers `hook` (e.g. releasing a lock) to run when a watchdog ends this process for a lost
    peer, just before it exits (each hook's errors ignored). Returns a function that removes it."""
    _STOP_HOOKS.append(hook)

    def remove() -> None:
        if hook in _STOP_HOOKS:
            _STOP_HOOKS.remove(hook)

    return remove


def run_stop_hooks() -> None:
    """Runs the `on_stop` hooks, newest first, once."""
    while _STOP_HOOKS:
        hook = _STOP_HOOKS.pop()
        try:
            hook()
        except Exception:
            pass


def start_peer_watchdog(timeout_s: float, interval_s: float | None = None) -> PeerWatchdog | None:
    """Starts the watchdog of this process (after `jax.distributed.initialize`); None with one
    process. Starting it twice returns the running one."""
    global _ACTIVE
    import jax
    from jax._src import distributed as jax_distributed  # the client: not in jax's public API

    if _ACTIVE is not None:
        return _ACTIVE
    client = jax_distributed.global_state.client
    if client is None or jax.process_count() == 1:
        return None
    _ACTIVE = PeerWatchdog(client, jax.process_index(), jax.process_count(), timeout_s, interval_s).start()
    # Registered after jax.distributed.initialize, so it runs before JAX's own shutdown at exit.
    atexit.register(_ACTIVE.stop)
    # said once, by process 0 (the others print warnings and errors only)
    log.log(
        logging.INFO if jax.process_index() == 0 else logging.DEBUG,
        "peer watchdog: a process silent for %.0f s stops the job",
        timeout_s,
    )
    return _ACTIVE


def active_watchdog() -> PeerWatchdog | None:
    """The watchdog `start_peer_watchdog` started in this process, if any."""
    return _ACTIVE


def await_lost_peer(seconds: float | None = None) -> bool:
    """For a caller that just caught an error from a collective (a peer that died mid-step shows
    up as e.g. "Gloo AllGather failed: Connection closed by peer"): waits until the watchdog has
    named the lost peer, which ends the process with its one line. Returns False at once without a
    watchdog, or False after `seconds` (default: the watchdog's bound plus its polling) when no
    peer was lost, so the caller re-raises its own error."""
    if _ACTIVE is None:
        return False
    log.info(  # the verdict's one line follows (or the caller's own error)
        "a collective failed; waiting up to %.0f s to see whether a peer process stopped",
        seconds if seconds is not None else _ACTIVE.timeout_s + 3 * _ACTIVE.interval_s + _ACTIVE.grace_s,
    )
    return _ACTIVE.wait_for_verdict(seconds)
