"""The console's progress display (design §7): one line, on a time interval, in a fixed order:

    step 120/600 (20%) loss 5.31 lr 1.0e-2 1.8 steps/s 3.1k tok/s MFU 41% ETA 4m25s

(a mixture-of-experts model adds `moe balance 2.05 dropped 3.1%` after the learning rate: the
load-balancing loss and the fraction of token assignments dropped for capacity).

On a terminal the line is a tqdm status line redrawn in place, and log records are written
through `tqdm.write` while it is shown (the line is cleared, the record printed, the line
redrawn: they never garble each other). In a file or a pipe it is one full line per interval.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

TTY_INTERVAL_S = 0.5  # redraws on a terminal
FILE_INTERVAL_S = 60.0  # full lines in a file or a pipe


def duration(seconds: float) -> str:
    """`4m25s`, `1h05m`, `12s`; `?` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _si(value: float) -> str:
    """`850`, `3.1k`, `12.4M`."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _exp(value: float) -> str:
    """`1.0e-2` (a learning rate: no zero-padded exponent)."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


#: The step metrics the progress line shows (when the step has them).
PROGRESS_METRICS = ("loss", "learning_rate", "moe/load_balance_loss", "moe/dropped_fraction")


def progress_text(step: int, total: int, values: Mapping[str, float]) -> str:
    """The progress line for `step` of `total` from the step's `values` (any of `PROGRESS_METRICS`,
    `steps_per_second`, `tokens_per_second`, `mfu`; absent ones are left out)."""
    parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)"]
    if "loss" in values:
        parts.append(f"loss {values['loss']:.3g}")
    if "learning_rate" in values:
        parts.append(f"lr {_exp(values['learning_rate'])}")
    if "moe/load_balance_loss" in values:
        parts.append(f"moe balance {values['moe/load_balance_loss']:.3g}")
    if "moe/dropped_fraction" in values:
        parts.append(f"dropped {100 * values['moe/dropped_fraction']:.1f}%")
    rate = values.get("steps_per_second", 0.0)
    if rate:
        parts.append(f"{rate:.3g} steps/s")
    if values.get("tokens_per_second"):
        parts.append(f"{_si(values['tokens_per_second'])} tok/s")
    if "mfu" in values:
        parts.append(f"MFU {100 * values['mfu']:.0f}%")
    parts.append(f"ETA {duration((total - step) / rate) if rate else '?'}")
    return " ".join(parts)


class _TqdmWrite(logging.Handler):
    """Writes records through `tqdm.write` with a replaced handler's formatter."""

    def __init__(self, replaced: logging.Handler, stream: TextIO):
        super().__init__(replaced.level)
        inner = getattr(replaced, "python_handler", replaced)  # absl's handler wraps a StreamHandler
        self.setFormatter(inner.formatter)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def _writes_to_terminal(handler: logging.Handler) -> bool:
    inner = getattr(handler, "python_handler", handler)
    stream = getattr(inner, "stream", None)
    return isinstance(inner, logging.StreamHandler) and stream in (sys.stderr, sys.stdout, sys.__stderr__)


@contextlib.contextmanager
def _logs_through_tqdm(stream: TextIO) -> Iterator[None]:
    """Root-logger handlers that write to the terminal go through `tqdm.write` meanwhile."""
    root = logging.getLogger()
    replaced = [h for h in root.handlers if _writes_to_terminal(h)]
    for h in replaced:
        root.removeHandler(h)
        root.addHandler(_TqdmWrite(h, stream))
    try:
        yield
    finally:
        for h in list(root.handlers):
            if isinstance(h, _TqdmWrite):
                root.removeHandler(h)
        for h in replaced:
            root.addHandler(h)


def _terminal_size(stream: TextIO) -> tuple[int, int]:
    """`(columns, lines)` of the terminal behind `stream`; `(0, 0)` when unknown."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return (size.columns, size.lines) if size.columns > 0 and size.lines > 0 else (0, 0)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return (0, 0)


class Console:
    """The progress display of a run of `total` steps on `stream` (default stderr); `enabled`
    False (e.g. processes other than 0) shows nothing. `interval_s`: seconds between updates
    (default 0.5 on a terminal, 60 in a file or pipe; there the first line comes one interval
    after the start). `clock` is for tests."""

    def __init__(
        self,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.enabled, self.clock = total, enabled, clock
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (TTY_INTERVAL_S if self.tty else FILE_INTERVAL_S)
        self.last_text = ""
        self._last_shown: float | None = None if self.tty else clock()  # a file's first line: one interval in
        self._bar: Any = None
        self._logs: contextlib.ExitStack | None = None

    def due(self) -> bool:
        """Whether an update now would be shown (the interval has passed since the last one)."""
        return self.enabled and (self._last_shown is None or self.clock() - self._last_shown >= self.interval_s)

    def update(self, step: int, values: Mapping[str, float], force: bool = False) -> bool:
        """Shows the progress at `step` if due (or `force`); returns whether it was shown."""
        if not (force and self.enabled) and not self.due():
            return False
        self._last_shown = self.clock()
        self.last_text = progress_text(step, self.total, values)
        if self.tty:
            self._draw(self.last_text)
        else:
            self.stream.write(self.last_text + "\n")
            self.stream.flush()
        return True

    def _draw(self, text: str) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._logs = contextlib.ExitStack()
            self._logs.enter_context(_logs_through_tqdm(self.stream))
            sized = _terminal_size(self.stream) > (0, 0)  # a pty may report 0 x 0: then fixed sizes
            self._bar = tqdm(
                file=self.stream,
                bar_format="{desc}",
                dynamic_ncols=sized,
                ncols=None if sized else 160,
                nrows=None if sized else 24,
                leave=True,
                mininterval=0,
            )
        self._bar.set_description_str(text, refresh=True)

    def close(self) -> None:
        """Leaves the last line on a terminal and gives the log handlers back."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._logs is not None:
            self._logs.close()
            self._logs = None
