"""A failed orbax save ends quietly: the writes still in flight finish before orbax closes its
event loop, and orbax's own error logs of a write the storage refused can be dropped (the
caller reports the failure once, as a `faults.StorageWriteError`).

Without this, a save that fails on a full disk or the file size limit prints a hundred or more
tracebacks: orbax runs each save's coroutine in a fresh event loop and closes it as soon as the
first write fails (`asyncio.gather` re-raises at once), while tensorstore is still writing the
other arrays; each of those writes then completes into the closed loop ("RuntimeError: Event loop
is closed"), and orbax's signalling threads log the failure with its traceback at ERROR.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from cairn.storage import retries
from cairn.trainer.faults import write_failure_code

DRAIN_TIMEOUT_S = 120.0  # how long the writes still in flight may take to finish after a failure


def drain_failed_saves() -> bool:
    """Makes orbax's synchronous runs of a coroutine (`asyncio_utils._run_sync_via_new_loop`, in
    orbax 0.12) wait, when the coroutine fails, for the other tasks it started on that loop
    (at most `DRAIN_TIMEOUT_S`, then cancelled) before the loop is closed. Idempotent; False
    when this orbax has no such function (nothing changed)."""
    from orbax.checkpoint._src import asyncio_utils

    real = getattr(asyncio_utils, "_run_sync_via_new_loop", None)
    if real is None:
        return False
    if getattr(real, "cairn_drains", False):
        return True

    @functools.wraps(real)
    def run_draining(coro: Coroutine[Any, Any, Any]) -> Any:
        return real(_draining(coro))

    run_draining.cairn_drains = True  # type: ignore[attr-defined]
    asyncio_utils._run_sync_via_new_loop = run_draining
    return True


async def _draining(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except BaseException:
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if others:
            _, late = await asyncio.wait(others, timeout=DRAIN_TIMEOUT_S)
            for task in late:
                task.cancel()
            for task in others:  # retrieved, so asyncio does not log "exception never retrieved"
                if task.done() and not task.cancelled():
                    task.exception()
        raise


class _DropWriteFailures(logging.Filter):
    """Drops log records carrying an exception that is a write the storage refused, or a bucket
    that stayed unavailable past the retry budget."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or (write_failure_code(error) is None and not retries.gave_up(error))


_FILTER = _DropWriteFailures()


def quiet_failed_save_logs(loggers: tuple[str, ...] = ("absl",)) -> Callable[[], None]:
    """Drops the records of `loggers` (orbax logs through absl's) whose exception is a write
    the storage refused (`faults.write_failure_code`) or a bucket operation that ran out of
    retries (`retries.gave_up`): the caller reports it in one line.
    Returns a function that undoes it."""
    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addFilter(_FILTER)

    def undo() -> None:
        for logger in targets:
            logger.removeFilter(_FILTER)

    return undo
