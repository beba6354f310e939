"""Records each Python process a test starts (tools/ci/test_times.py counts them).

`tools/testing/pytest_main.py` puts this folder on the PYTHONPATH of the processes a test
starts and names a log in `CAIRN_TEST_PROCESS_LOG`; every interpreter that starts with both
appends one JSON line (its pid and command line) to that log, and at a normal exit another
(whether it imported TensorFlow, its CPU seconds). One `write` on a file opened for appending,
so lines from concurrent processes never interleave. Outside a test nothing is set and this
does nothing.
"""

import json
import os
import sys

_log = os.environ.get("CAIRN_TEST_PROCESS_LOG")


def _append(record: dict) -> None:
    try:
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a test's own environment (a read-only tmp) never fails a child for this


def _at_exit() -> None:
    """A second line at a normal exit: whether TensorFlow was imported (about 4 s of every
    process that does) and the CPU seconds used. A killed process or `os._exit` writes none."""
    t = os.times()
    _append({"pid": os.getpid(), "exit": True, "tensorflow": "tensorflow" in sys.modules, "cpu_s": t.user + t.system})


if _log:
    import atexit

    _append({"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv))})
    atexit.register(_at_exit)
