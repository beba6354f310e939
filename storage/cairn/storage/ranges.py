"""Byte ranges of files, many at once: one `pread` each locally, one ranged GET each at a URL.

A reader that knows where its data lies (a chunk index recorded when the file was written)
needs no open file object, no per-file client state and no read-ahead buffer: a range is
one request, and the requests of one call are in flight together (fsspec's `cat_ranges`
runs them on its event loop).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cairn.storage.errors import StorageError
from cairn.storage.paths import PathLike, filesystem, is_url, scheme


def read_ranges(requests: Sequence[tuple[PathLike, int, int]]) -> list[bytes]:
    """The bytes `[start, end)` of each `(path, start, end)`, in order.

    Local paths: each file is opened once per call and read with `os.pread`. URLs: one
    ranged GET per range, all of one call in flight at once. A range that is empty, negative
    or past the end of its file raises `StorageError` naming the path and the range."""
    out: list[bytes | None] = [None] * len(requests)
    local: dict[str, list[int]] = {}
    remote: dict[str | None, list[int]] = {}
    for i, (p, start, end) in enumerate(requests):
        if not 0 <= int(start) < int(end):
            raise StorageError(f"{os.fspath(p)}: bad byte range [{start}, {end})")
        s = os.fspath(p)
        if is_url(s):
            remote.setdefault(scheme(s), []).append(i)
        else:
            local.setdefault(s, []).append(i)
    for p, which in local.items():
        fd = os.open(p, os.O_RDONLY)
        try:
            for i in which:
                start, end = int(requests[i][1]), int(requests[i][2])
                out[i] = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
    for which in remote.values():
        fs, _ = filesystem(os.fspath(requests[which[0]][0]))
        inner = [fs._strip_protocol(os.fspath(requests[i][0])) for i in which]
        got = fs.cat_ranges(
            inner, [int(requests[i][1]) for i in which], [int(requests[i][2]) for i in which], on_error="return"
        )
        for i, data in zip(which, got):
            if isinstance(data, BaseException):
                raise StorageError(
                    f"{os.fspath(requests[i][0])}: reading bytes [{requests[i][1]}, {requests[i][2]}) "
                    f"failed: {type(data).__name__}: {data}"
                ) from data
            out[i] = bytes(data)
    for i, data in enumerate(out):
        p, start, end = requests[i]
        if data is None or len(data) != int(end) - int(start):
            raise StorageError(
                f"{os.fspath(p)}: bytes [{start}, {end}) asked, {0 if data is None else len(data)} read "
                f"(the file is shorter: truncated or replaced)"
            )
    return out  # type: ignore[return-value]
