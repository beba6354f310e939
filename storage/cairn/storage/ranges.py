"""Byte ranges of files, many at once: one `pread` each locally, one ranged GET each at a URL.

A reader that knows where its data lies (a chunk index recorded when the file was written)
needs no open file object, no per-file client state and no read-ahead buffer: a range is
one request, and the requests of one call are in flight together on the filesystem's event
loop.

On `gs://` each range is one GET on gcsfs's own pooled aiohttp session, with gcsfs's
credentials (refreshed as gcsfs refreshes them), without gcsfs's per-request layers (its
retry wrapper, debug formatting, header and parameter building): about half the client CPU
per request (benchmarks/README.md, `reader_scale_bench.py`). A response other than
206 Partial Content that is transient (408, 429, 5xx), a dropped connection or a body cut short
is retried under the retry budget (`cairn.storage.retries`), the same as gcsfs's own requests;
any other answer goes through gcsfs's `_cat_file`, so its errors stay gcsfs's. Other schemes,
and gcsfs with `requester_pays` (whose `userProject` gcsfs adds), use fsspec's `cat_ranges`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from cairn.storage import retries
from cairn.storage.environment import EMULATOR_VARIABLE
from cairn.storage.errors import StorageError, StorageUnavailableError
from cairn.storage.paths import PathLike, filesystem, is_url, scheme

# (id of the gcsfs instance, its emulator endpoint if any, path) -> the object's download URL
_URLS: dict[tuple[int, str, str], str] = {}
_MAX_URLS = 1 << 16


def _is_gcsfs(fs: Any) -> bool:
    try:
        import gcsfs
    except ImportError:
        return False
    return isinstance(fs, gcsfs.GCSFileSystem)


def _object_url(fs: Any, inner: str) -> str:
    """gcsfs's download URL of `inner` (`bucket/object`), kept (a reader asks for the same
    shards again and again; gcsfs takes ~30 us to build one)."""
    key = (id(fs), os.environ.get(EMULATOR_VARIABLE, ""), inner)
    url = _URLS.get(key)
    if url is None:
        if len(_URLS) >= _MAX_URLS:
            _URLS.clear()
        url = _URLS[key] = fs.url(inner)
    return url


async def _gcs_get(fs: Any, url: str, inner: str, start: int, end: int) -> bytes:
    """`[start, end)` of one object: a ranged GET on gcsfs's session. A transient failure (408,
    429, 5xx, a dropped connection, a body cut short of its Content-Length) is retried under the retry budget
    (`retries.Attempts`: `StorageUnavailableError` once it is spent); any other answer but a
    206 goes through gcsfs's `_cat_file` (its errors: a missing object, a bad range)."""
    import aiohttp

    attempts: retries.Attempts | None = None
    while True:
        try:
            headers = {"Range": f"bytes={start}-{end - 1}"}
            fs.credentials.apply(headers)  # an auth token, refreshed when stale (none against an emulator)
            async with fs.session.get(url, headers=headers, timeout=fs.requests_timeout) as r:
                if r.status == 206:  # a body cut short of its Content-Length raises (retried below)
                    data = await r.read()  # shorter than asked: the object is (read_ranges says so)
                    retries.succeeded()
                    return data
                if r.status in retries.RETRIABLE_STATUS:
                    cause: BaseException | str = f"HTTP {r.status}"
                else:
                    break
        except (aiohttp.ClientError, OSError) as e:  # OSError includes TimeoutError
            cause = e
        if attempts is None:
            attempts = retries.Attempts(retries.bucket_of(inner), f"reading bytes [{start}, {end}) of gs://{inner}")
        await asyncio.sleep(attempts.wait(cause))
    return await fs._cat_file(inner, start=start, end=end)


async def _gcs_ranges(fs: Any, urls: list[str], inner: list[str], starts: list[int], ends: list[int]) -> list:
    await fs._set_session()
    return await asyncio.gather(
        *(_gcs_get(fs, u, p, s, e) for u, p, s, e in zip(urls, inner, starts, ends)), return_exceptions=True
    )


def _read_remote(fs: Any, inner: list[str], starts: list[int], ends: list[int]) -> list:
    """The ranges of one filesystem, in flight together: bytes, or the exception of each."""
    if _is_gcsfs(fs) and not getattr(fs, "requester_pays", False):  # (gcsfs adds its userProject)
        from fsspec.asyn import sync

        urls = [_object_url(fs, p) for p in inner]
        return sync(fs.loop, _gcs_ranges, fs, urls, inner, starts, ends)
    return fs.cat_ranges(inner, starts, ends, on_error="return")


def read_ranges(requests: Sequence[tuple[PathLike, int, int]]) -> list[bytes]:
    """The bytes `[start, end)` of each `(path, start, end)`, in order.

    Local paths: each file is opened once per call and read with `os.pread`. URLs: one
    ranged GET per range, all of one call in flight at once (on `gs://` on gcsfs's session,
    see the module's notes). A range that is empty, negative
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
        got = _read_remote(fs, inner, [int(requests[i][1]) for i in which], [int(requests[i][2]) for i in which])
        for i, data in zip(which, got):
            if isinstance(data, StorageUnavailableError):
                raise data  # names the bucket and the operation already
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
