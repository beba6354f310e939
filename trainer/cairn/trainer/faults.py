"""Fault handling for the loop: SIGTERM as a request to save and stop; non-finite losses; a
write the storage refuses (a full disk, a quota, the file size limit, a read-only path)."""

from __future__ import annotations

import errno
import os
import re
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


class StorageOutageError(storage.StorageError):
    """The run's bucket stayed unavailable past the retry budget (`outage`, the first operation
    that gave up, names the bucket and the operation): training stopped; the line names the last
    good checkpoint, which is kept (resuming starts from it)."""

    def __init__(self, outage: storage.StorageUnavailableError, model_dir: str, last_checkpoint: int | None):
        self.outage, self.last_checkpoint = outage, last_checkpoint
        kept = (
            f"the last good checkpoint (step {last_checkpoint}) is kept in {model_dir}"
            if last_checkpoint is not None
            else f"no checkpoint of {model_dir} was restored or written before it"
        )
        super().__init__(f"{outage}; training stopped and {kept}")

    def __str__(self) -> str:
        return str(self.args[0])


# errno -> what the one line says (a write refused by the storage, not by a bug)
WRITE_FAILURES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
# the same failures as text (tensorstore's and gcsfs' messages carry no OSError)
_TEXTS = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "File too large": errno.EFBIG,
    "Read-only file system": errno.EROFS,
}
_OS_ERROR_CODE = re.compile(r"os_error_code='(\d+)'")  # tensorstore's "[os_error_code='28']"


class StorageWriteError(storage.StorageError):
    """A write the storage refused (no space, a quota, the file size limit, a read-only or
    forbidden path): one line naming the path, what was written, why and the last good
    checkpoint (which is left intact). `errno` is the failure's; `free_bytes` the free space
    measured when the write failed (for a full disk; None: measured now)."""

    def __init__(
        self,
        path: str,
        what: str,
        last_checkpoint: int | None,
        code: int = errno.ENOSPC,
        free_bytes: int | None = None,
    ):
        self.path, self.last_checkpoint = path, last_checkpoint
        kept = (
            f"the last good checkpoint (step {last_checkpoint}) is intact"
            if last_checkpoint is not None
            else "no checkpoint was written"
        )
        why = WRITE_FAILURES.get(code, os.strerror(code).lower())
        super().__init__(code, f"{why} writing {what} in {path}{_detail(path, code, free_bytes)}; {kept}")

    def __str__(self) -> str:
        return str(self.strerror)


class DiskFullError(StorageWriteError):
    """No space left (or a quota reached) where the run writes: the line names the free space."""


def write_failure(
    path: str, what: str, last_checkpoint: int | None, code: int, free_bytes: int | None = None
) -> StorageWriteError:
    """The `StorageWriteError` for `code` (a `DiskFullError` for ENOSPC and EDQUOT). `free_bytes`:
    the free space measured when the write failed, before anything was cleaned up (the line must
    not report the space a removed partial write gave back)."""
    cls = DiskFullError if code in (errno.ENOSPC, errno.EDQUOT) else StorageWriteError
    return cls(path, what, last_checkpoint, code, free_bytes)


def _detail(path: str, code: int, free_bytes: int | None = None) -> str:
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes if free_bytes is not None else free_space(path)
        return f" ({_human(free)} free)" if free is not None else " (free space unknown)"
    if code == errno.EFBIG:
        limit = file_size_limit()
        return f" (over this process's file size limit of {_human(limit)}: ulimit -f)" if limit else ""
    return ""


def file_size_limit() -> int | None:
    """This process's file size limit in bytes (`ulimit -f`), None when unlimited or unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def write_failure_code(error: BaseException | None) -> int | None:
    """The errno of a storage write failure (`WRITE_FAILURES`) that `error` is, or was raised
    from or during (an `OSError`, or tensorstore's text for one); None for anything else."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in WRITE_FAILURES:
            return error.errno
        text = str(error)
        match = _OS_ERROR_CODE.search(text)
        if match and int(match.group(1)) in WRITE_FAILURES:
            return int(match.group(1))
        for words, code in _TEXTS.items():
            if words in text:
                return code
        error = error.__cause__ or error.__context__
    return None


def is_disk_full(error: BaseException | None) -> bool:
    """True when `error` or one it was raised from/during is a full disk or quota (ENOSPC,
    EDQUOT, or tensorstore's text for them)."""
    return write_failure_code(error) in (errno.ENOSPC, errno.EDQUOT)


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
