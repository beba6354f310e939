"""Writes that are never seen half-done.

Local files: written to a temporary name in the same directory, flushed to disk, then renamed
over the target (a rename is atomic on POSIX). Object stores cannot rename: there a file is one
upload of the whole object, which the store makes visible only when the upload completes (an
object is never readable half-written). Both replace an existing file whole.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from cairn.storage.paths import PathLike, filesystem, is_url


def local_temporary(target: str, data: bytes) -> str:
    """Writes `data` to a new hidden temporary beside the local file `target` (parents created),
    flushed to disk; returns its name. The caller renames or links it, then removes it."""
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_bytes(p: PathLike, data: bytes) -> None:
    """Writes `data` to `p` atomically (parents created)."""
    s = os.fspath(p)
    if is_url(s):
        fs, inner = filesystem(s)
        fs.pipe_file(inner, bytes(data))
        return
    tmp = local_temporary(s, data)
    try:
        os.replace(tmp, s)
    except BaseException:
        os.unlink(tmp)
        raise


def copy_file(local: str, p: PathLike) -> None:
    """Copies the finished local file `local` to `p` atomically without reading it into memory:
    a copy then a rename locally, one upload (streamed) at a URL."""
    s = os.fspath(p)
    if is_url(s):
        fs, inner = filesystem(s)
        fs.put_file(local, inner)
        return
    tmp = local_temporary(s, b"")
    try:
        shutil.copyfile(local, tmp)
        os.replace(tmp, s)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(p: PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `p` atomically."""
    write_bytes(p, text.encode("utf-8"))


def write_json(p: PathLike, value: Any, **dumps_kwargs: Any) -> None:
    """Writes `value` as JSON to `p` atomically (`sort_keys=True` unless given)."""
    dumps_kwargs.setdefault("sort_keys", True)
    write_text(p, json.dumps(value, **dumps_kwargs))


def read_bytes(p: PathLike) -> bytes:
    """The bytes of `p` (local or URL)."""
    s = os.fspath(p)
    if is_url(s):
        fs, inner = filesystem(s)
        return fs.cat_file(inner)
    with open(s, "rb") as f:
        return f.read()


def read_text(p: PathLike) -> str:
    return read_bytes(p).decode("utf-8")


def read_json(p: PathLike) -> Any:
    return json.loads(read_bytes(p))
