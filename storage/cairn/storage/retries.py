"""The retry budget: one setting for how long a failing bucket operation is retried, applied to
every client that reaches `gs://`.

A request that fails transiently (HTTP 408, 429, 500-504, a connection dropped or reset, a
body cut short) is retried with exponential backoff: the first wait is `min(1 s, budget / 64)`,
each next one doubles, at most `MAX_WAIT_S`, each shortened by up to a quarter at random (so a
pod's hosts do not retry in step). Once `budget` seconds have passed since the operation's first
failure (the next wait would end past it), the operation fails with `StorageUnavailableError`
naming the bucket and the operation, and the process records an outage: until a request
succeeds again, a failing request in this process is not retried (a run that is stopping does
not wait a budget again for each file it closes). A request that succeeds never waits.

The budget is `CAIRN_STORAGE_RETRY_S` (seconds, default `DEFAULT_RETRY_S` = 300), read when an
operation first fails, so child processes inherit it; `set_retry_budget` sets it. It applies to

- the direct GET path of `read_ranges` (its own loop, `Attempts`);
- gcsfs (every JSON-API request and download: `install_gcsfs` replaces gcsfs's fixed six
  attempts, about 31 s, with this loop);
- tensorstore, hence orbax's array writes and reads (`tensorstore_context`: its
  `gcs_request_retries` resource, `max_retries` counted from the same schedule, since tensorstore
  counts attempts rather than seconds; cairn.trainer puts it into orbax's contexts).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator, MutableMapping
from typing import Any

from cairn.storage.errors import StorageUnavailableError

RETRY_VARIABLE = "CAIRN_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 300.0
MAX_WAIT_S = 32.0
RETRIABLE_STATUS = frozenset({408, 429, 500, 501, 502, 503, 504})

_lock = threading.Lock()
_outage: StorageUnavailableError | None = None
_jitter = random.Random()  # spreads the hosts' retries; shapes no data


def retry_budget(environ: MutableMapping[str, str] | None = None) -> float:
    """Seconds a failing operation is retried (`CAIRN_STORAGE_RETRY_S`; ValueError naming the
    variable if it is not a number >= 0)."""
    raw = (os.environ if environ is None else environ).get(RETRY_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_RETRY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{RETRY_VARIABLE}={raw!r}: the storage retry budget must be a number of seconds >= 0")
    return value


def set_retry_budget(seconds: float, environ: MutableMapping[str, str] | None = None) -> None:
    """Sets the budget for this process and the processes it starts."""
    if not seconds >= 0:
        raise ValueError(f"the storage retry budget must be >= 0 seconds, got {seconds}")
    (os.environ if environ is None else environ)[RETRY_VARIABLE] = f"{float(seconds):g}"


def waits(budget: float) -> Iterator[float]:
    """The schedule's waits before each retry (without jitter): first `min(1, budget/64)`,
    doubling, at most `MAX_WAIT_S`."""
    wait = min(1.0, budget / 64) or 0.001
    while True:
        yield wait
        wait = min(wait * 2, MAX_WAIT_S)


def declared_outage() -> StorageUnavailableError | None:
    """The first operation of this process that used up its budget (None: none did)."""
    return _outage


def declare(error: StorageUnavailableError) -> StorageUnavailableError:
    """Records `error` as this process's outage (the first one is kept); returns it."""
    global _outage
    with _lock:
        if _outage is None:
            _outage = error
    return error


def succeeded() -> None:
    """A request succeeded: a recorded outage is over (later failures are retried again)."""
    if _outage is not None:
        reset_outage()


def reset_outage() -> None:
    """Forgets the recorded outage (for tests that bring the bucket back in one process)."""
    global _outage
    with _lock:
        _outage = None


_BUCKET = re.compile(r"(?:^|/)b/([^/?#]+)")


def bucket_of(url: str) -> str:
    """The bucket a JSON-API URL (`.../b/<bucket>/o...`) or a `bucket/object` path names."""
    m = _BUCKET.search(url)
    if m:
        return m.group(1)
    return url.split("://", 1)[-1].split("/", 1)[0]


class Attempts:
    """The retries of one failing operation: `wait(cause)` is the seconds to sleep before the next
    attempt, or raises `StorageUnavailableError` (recorded as the process's outage) when the
    budget is spent or an outage was already recorded."""

    def __init__(self, bucket: str, operation: str):
        self.bucket, self.operation = bucket, operation
        self._first: float | None = None
        self._waits: Iterator[float] | None = None
        self._budget = 0.0

    def wait(self, cause: BaseException | str) -> float:
        now = time.monotonic()
        if self._first is None:
            self._first, self._budget = now, retry_budget()
            self._waits = waits(self._budget)
        assert self._waits is not None
        wait = next(self._waits) * (1 - 0.25 * _jitter.random())
        spent = now - self._first
        if _outage is not None or spent + wait > self._budget:
            why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}".rstrip(": ")
            raise declare(StorageUnavailableError(self.bucket, self.operation, spent, self._budget, why))
        return wait


# -- gcsfs ---------------------------------------------------------------------------------

_OBJECT = re.compile(r"(?:^|/)b/([^/?#]+)(?:/o(?:/([^?#]+))?)?")
_VERBS = {
    "GET": "reading",
    "HEAD": "reading",
    "POST": "writing",
    "PUT": "writing",
    "PATCH": "updating",
    "DELETE": "deleting",
}
_GCSFS_METHODS = ("_request", "_get_file_request")
_gcsfs_installed = False


def _gcsfs_retriable(error: BaseException) -> bool:
    """What gcsfs's own retry loop retries (its `is_retriable`), 404s never."""
    import aiohttp
    from gcsfs import retry as gretry

    if isinstance(error, aiohttp.ClientResponseError) and error.status == 404:
        return False
    if isinstance(error, gretry.HttpError) and error.code == 404:
        return False
    return gretry.is_retriable(error)


def _describe(method_name: str, args: tuple, kwargs: dict) -> tuple[str, str]:
    """`(bucket, operation)` of a gcsfs request: `_request(method, path, *path_args, **params)`
    or `_get_file_request(rpath, lpath)`."""
    if method_name == "_get_file_request":
        rpath = str(args[0]) if args else "?"
        return bucket_of(rpath), f"downloading gs://{rpath.split('://', 1)[-1]}"
    method = str(args[0]).upper() if args else "?"
    text = str(args[1]) if len(args) > 1 else "?"
    rest = args[2:]
    if rest and "{}" in text:
        try:
            text = text.format(*rest)
        except (IndexError, KeyError, ValueError):
            pass
    where, _, query = text.partition("?")
    m = _OBJECT.search(where)
    if m is None:
        return bucket_of(text), f"{method} {where}"
    bucket, name = urllib.parse.unquote(m.group(1)), m.group(2)
    name = urllib.parse.unquote(name) if name else _upload_name(query, kwargs) or kwargs.get("prefix") or ""
    verb = _VERBS.get(method, method)
    if method == "GET" and not m.group(2):
        verb = "listing"
    return bucket, f"{verb} gs://{bucket}/{name}"


_NAME_IN_METADATA = re.compile(rb'"name": ("(?:[^"\\]|\\.)*")')


def _upload_name(query: str, kwargs: dict) -> str | None:
    """The object an upload names: `?name=`, its JSON metadata, or a multipart body's."""
    name = urllib.parse.parse_qs(query).get("name", [None])[0] or kwargs.get("name")
    if name is None and isinstance(kwargs.get("json"), dict):
        name = kwargs["json"].get("name")
    data = kwargs.get("data")
    if name is None and isinstance(data, (bytes, bytearray, memoryview)):
        m = _NAME_IN_METADATA.search(bytes(data[:4096]))
        if m:
            try:
                name = json.loads(m.group(1))
            except ValueError:
                name = None
    return name


def _budgeted(inner: Any, method_name: str) -> Any:
    @functools.wraps(inner)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        attempts: Attempts | None = None
        while True:
            try:
                result = await inner(self, *args, **kwargs)
            except Exception as e:
                if not _gcsfs_retriable(e):
                    raise
                if attempts is None:
                    attempts = Attempts(*_describe(method_name, args, kwargs))
                try:
                    wait = attempts.wait(e)
                except StorageUnavailableError as unavailable:
                    raise unavailable from e
                await asyncio.sleep(wait)
                continue
            succeeded()
            return result

    call.cairn_retry_budget = True  # type: ignore[attr-defined]
    return call


def install_gcsfs() -> bool:
    """gcsfs's requests retried under the budget instead of gcsfs's six attempts (idempotent;
    False when this gcsfs has no such methods: its own retries stay)."""
    global _gcsfs_installed
    if _gcsfs_installed:
        return True
    try:
        import gcsfs
    except ImportError:
        return False
    cls = gcsfs.GCSFileSystem
    with _lock:
        for name in _GCSFS_METHODS:
            current = getattr(cls, name, None)
            if current is None:
                return False
            if getattr(current, "cairn_retry_budget", False):
                continue
            inner = getattr(current, "__wrapped__", None)
            if inner is None:
                return False
            setattr(cls, name, _budgeted(inner, name))
        _gcsfs_installed = True
    return True


# -- tensorstore ---------------------------------------------------------------------------


def tensorstore_retries(budget: float | None = None) -> dict:
    """tensorstore's `gcs_request_retries` for the budget: as many attempts as the schedule's
    waits fit in it (at least 1), its first wait and `MAX_WAIT_S`."""
    budget = retry_budget() if budget is None else budget
    total, count, schedule = 0.0, 0, waits(budget)
    first = next(waits(budget))
    for wait in schedule:
        if total + wait > budget:
            break
        total, count = total + wait, count + 1
    return {"max_retries": max(count, 1), "initial_delay": f"{first:g}s", "max_delay": f"{MAX_WAIT_S:g}s"}


def tensorstore_context(budget: float | None = None) -> dict:
    """The tensorstore context resources that apply the budget (merge into a context spec)."""
    return {"gcs_request_retries": tensorstore_retries(budget)}


_TENSORSTORE_GAVE_UP = re.compile(r"All \d+ retry attempts failed")  # tensorstore's words when its retries ran out


def gave_up(error: BaseException | None) -> bool:
    """Whether `error`, or one it was raised from or during, is a bucket operation that ran out of
    retries (a `StorageUnavailableError`, or tensorstore's error for one)."""
    return _gave_up(error) is not None


def _gave_up(error: BaseException | None) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, StorageUnavailableError) or _TENSORSTORE_GAVE_UP.search(str(error)):
            return error
        error = error.__cause__ or error.__context__
    return None


def as_outage(error: BaseException | None, bucket: str, operation: str) -> StorageUnavailableError | None:
    """The `StorageUnavailableError` that `error` is or was raised from or during; a tensorstore
    error that ran out of retries becomes one naming `bucket` and `operation` (recorded as the
    outage). None when `error` is something else."""
    found = _gave_up(error)
    if found is None or isinstance(found, StorageUnavailableError):
        return found
    text = str(found)
    first = text.splitlines()[0][:300] if text else type(found).__name__
    budget = retry_budget()
    return declare(StorageUnavailableError(bucket, operation, budget, budget, first))
