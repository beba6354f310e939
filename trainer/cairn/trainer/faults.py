"""Fault handling for the loop: SIGTERM as a request to save and stop; non-finite losses; a
full disk."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import threading

import jax
import numpy as np

from cairn import storage


class NonFiniteLossError(FloatingPointError):
    """The loss (or gradient norm) became NaN or Inf; training stopped."""

    def __init__(self, step: int, value: float, name: str, last_checkpoint: int | None, model_dir: str):
        self.step, self.value, self.last_checkpoint = step, value, last_checkpoint
        kept = (
            f"the last good checkpoint (step {last_checkpoint}) is kept in {model_dir}"
            if last_checkpoint is not None
            else "no checkpoint was written"
        )
        super().__init__(f"{name} is {value} at step {step}; training stopped and {kept}")


class DiskFullError(storage.StorageError):
    """No space left where the run writes: one line naming the path, the free space and the last
    good checkpoint (which is left intact)."""

    def __init__(self, path: str, what: str, last_checkpoint: int | None):
        self.path, self.last_checkpoint = path, last_checkpoint
        free = free_space(path)
        room = f"{_human(free)} free" if free is not None else "free space unknown"
        kept = (
            f"the last good checkpoint (step {last_checkpoint}) is intact"
            if last_checkpoint is not None
            else "no checkpoint was written"
        )
        super().__init__(errno.ENOSPC, f"no space left on device writing {what} in {path} ({room}); {kept}")

    def __str__(self) -> str:
        return str(self.strerror)


def is_disk_full(error: BaseException | None) -> bool:
    """True when `error` or one it was raised from/during is a full disk or quota (ENOSPC, EDQUOT,
    or tensorstore's text for them)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def free_space(path: str | os.PathLike) -> int | None:
    """Free bytes on the local file system holding `path` (its nearest existing ancestor); None
    for a URL."""
    p = os.fspath(path)
    if storage.is_url(p):
        return None
    p = os.path.abspath(p)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _human(n: int) -> str:
    size, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


class SigtermFlag:
    """Turns SIGTERM into a flag the loop polls after each step (main thread only; elsewhere it
    does nothing). Restores the previous handler on `uninstall`."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def _handle(self, signum, frame):
        self.requested = True

    def install(self) -> SigtermFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self._installed = False


def stop_reason(sigterm: SigtermFlag, step: int) -> str | None:
    """Why to stop after `step` (None: go on): SIGTERM on this process or, with several
    processes, on another (the flags are all-gathered after every step, so all hosts stop at
    the same step).

    With several processes, `jax.distributed.initialize` installs JAX's own SIGTERM handler
    (its preemption notifier); `Trainer.train` replaces it with ours, but a SIGTERM that arrives
    before goes to JAX, so JAX's preemption sync point is consulted too, every step."""
    if jax.process_count() > 1:
        if _any_process(sigterm.requested):
            return "SIGTERM on this process" if sigterm.requested else "SIGTERM on another process"
        return "JAX's preemption notice" if _preemption_sync_point(step) else None
    return "SIGTERM" if sigterm.requested else None


def _any_process(flag: bool) -> bool:
    """True on every process if it is True on any (a tiny all-gather; multi-process runs only)."""
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.asarray([flag], np.int32))).any())


def _preemption_sync_point(step: int) -> bool:
    """JAX's preemption sync point (True on every host at one step after any got SIGTERM)."""
    from jax.experimental import multihost_utils

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # no preemption sync manager (distributed runtime without it)
        return False
