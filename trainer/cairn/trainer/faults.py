"""Fault handling for the loop: SIGTERM as a request to save and stop; non-finite losses."""

from __future__ import annotations

import signal
import threading
from typing import Optional


class NonFiniteLossError(FloatingPointError):
    """The loss (or gradient norm) became NaN or Inf; training stopped."""

    def __init__(self, step: int, value: float, name: str, last_checkpoint: Optional[int], model_dir: str):
        self.step, self.value, self.last_checkpoint = step, value, last_checkpoint
        kept = (f"the last good checkpoint (step {last_checkpoint}) is kept in {model_dir}"
                if last_checkpoint is not None else "no checkpoint was written")
        super().__init__(f"{name} is {value} at step {step}; training stopped and {kept}")


class SigtermFlag:
    """Turns SIGTERM into a flag the loop polls after each step (main thread only; elsewhere it
    does nothing). Restores the previous handler on `uninstall`."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def _handle(self, signum, frame):
        self.requested = True

    def install(self) -> "SigtermFlag":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self._installed = False
