"""Records each Python process a test starts (tools/ci/test_times.py counts them).

`tools/testing/pytest_main.py` puts this folder on the PYTHONPATH of the processes a test
starts and names a log in `CAIRN_TEST_PROCESS_LOG`; every interpreter that starts with both
appends one JSON line (its pid and command line) to that log. One `write` on a file opened
for appending, so lines from concurrent processes never interleave. Outside a test nothing
is set and this does nothing.
"""

import json
import os
import sys

_log = os.environ.get("CAIRN_TEST_PROCESS_LOG")
if _log:
    try:
        _line = json.dumps({"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv))}) + "\n"
        _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(_fd, _line.encode())
        finally:
            os.close(_fd)
    except OSError:
        pass  # a test's own environment (a read-only tmp) never fails a child for this
