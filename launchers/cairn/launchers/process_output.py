"""Process 0 speaks: what each process of a multi-process run prints.

- Process 0 prints as one process does (the progress line, the summary, its INFO logs).
- Every other process logs warnings and errors only (INFO too with `--verbose`), each record
  prefixed with its index, `process 1/4: ...`, as is its one-line error (`error: process 1/4:
  ...`); its metrics are not logged at all (the trainer logs them at DEBUG on every process).
- Gloo's connection lines (`[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of
  connected peer ranks is : 1`, written by the C++ library straight to file descriptor 1 each
  time a process group connects) are dropped unless `--verbose`: file descriptor 1 becomes a
  pipe read by a thread that forwards every other byte to the real stdout at once (`GlooFilter`),
  and gives the real stdout back at exit, once the thread has forwarded everything written
  before (a mark it waits for: another process holding a copy of the pipe's write end means
  its end of file may never come).

No JAX import here: `speak_from_process_0` takes the index and count.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
from collections.abc import Callable

from cairn.launchers import entry

GLOO_PREFIX = b"[Gloo]"
GLOO_TEMPLATE = b"[Gloo] Rank # is connected to # peer ranks. Expected number of connected peer ranks is : #"
# Written through the pipe by `GlooFilter.close`: everything before it has been forwarded once
# the thread reads it (never forwarded itself).
DRAINED_MARK = b"\x00cairn-stdout-drained\x00"


class _ProcessPrefix(logging.Filter):
    """Prefixes every record's message with `process i/N: ` (once)."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.prefix):
            record.msg, record.args = self.prefix + message, None
        return True


def speak_from_process_0(process_id: int, num_processes: int, verbose: bool) -> None:
    """Sets up this process's output for a run of `num_processes` (nothing on one process):
    see the module docstring."""
    if num_processes <= 1:
        return
    if process_id != 0:
        entry.PROCESS_TAG = f"process {process_id}/{num_processes}: "  # its one-line errors too
        prefix = _ProcessPrefix(entry.PROCESS_TAG)
        for handler in logging.getLogger().handlers:
            handler.addFilter(prefix)
        if not verbose:
            logging.getLogger("cairn").setLevel(logging.WARNING)
    if not verbose:
        GlooFilter.install()


def is_gloo_line(line: bytes, after_gloo: bool = False) -> bool:
    """Whether `line` (no newline) is Gloo's connection message or, right after one, a piece of
    it (C++ writes it in pieces, which another writer's bytes can split onto separate lines)."""
    text = line.strip()
    if text.startswith(GLOO_PREFIX) or b"connected peer ranks" in text:
        return True
    return after_gloo and bool(text) and re.sub(rb"\d+", b"#", text) in GLOO_TEMPLATE


class GlooFilter:
    """File descriptor `fd` (stdout) through a pipe and a thread that drops Gloo's lines
    (`is_gloo_line`) and forwards the rest at once; `close()` (registered at exit) waits until
    the thread has forwarded everything written before it (at most `CLOSE_TIMEOUT_S`), then
    restores `fd`."""

    _active: GlooFilter | None = None
    CLOSE_TIMEOUT_S = 30.0

    def __init__(self, fd: int = 1, drop: Callable[[bytes, bool], bool] = is_gloo_line):
        self.fd, self.drop = fd, drop
        _flush_python_streams()
        self.real = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._drained = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="cairn-gloo-filter", daemon=True)
        self._thread.start()

    @classmethod
    def install(cls) -> GlooFilter:
        """The process's filter on stdout (one; closed at exit)."""
        if cls._active is None:
            cls._active = cls()
            atexit.register(cls._active.close)
        return cls._active

    def _pump(self) -> None:
        pending, after_gloo = b"", False
        while True:
            try:
                chunk = os.read(self._read_end, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            out, drained = [], False
            for line in lines:
                if DRAINED_MARK in line:  # `close`'s mark: what came before it is forwarded below
                    before = line.split(DRAINED_MARK)[0]
                    if before and not self.drop(before, after_gloo):
                        out.append(before)  # a line the program left unended
                    drained, after_gloo = True, False
                    continue
                dropped = self.drop(line, after_gloo)
                after_gloo = dropped
                if not dropped:
                    out.append(line + b"\n")
            if pending and not GLOO_PREFIX.startswith(pending[: len(GLOO_PREFIX)]) and not after_gloo:
                out.append(pending)  # a line in progress that cannot be Gloo's (a progress redraw)
                pending = b""
            self._write(b"".join(out))
            if drained:
                self._drained.set()
        if pending and not self.drop(pending, after_gloo):
            self._write(pending)
        os.close(self._read_end)

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.real, data) :]
            except OSError:  # a closed pipe: nothing more can be written
                return

    def close(self) -> None:
        """Gives `fd` back once the thread has forwarded everything written so far: a mark is
        written through the pipe and waited for (at most `CLOSE_TIMEOUT_S`), then `fd` is the
        real stdout again (the thread reads to the end of the pipe, if it comes)."""
        if self._thread is None:
            return
        _flush_python_streams()
        try:
            os.write(self.fd, DRAINED_MARK + b"\n")
            self._drained.wait(self.CLOSE_TIMEOUT_S)
        except OSError:
            pass
        os.dup2(self.real, self.fd)
        self._thread.join(timeout=1)
        self._thread = None  # type: ignore[assignment]
        if GlooFilter._active is self:
            GlooFilter._active = None


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
