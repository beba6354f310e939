"""Paths that may be local or URLs (`gs://bucket/x`, `s3://bucket/x`), through `etils.epath`.

`etils.epath` is what orbax already uses for checkpoints, so one abstraction covers Cairn's
files and orbax's. Local paths are plain POSIX paths, behaving as `pathlib` did; URLs go
through fsspec (gcsfs for `gs://`, s3fs for `s3://` when installed), never through
`pathlib` (which turns `gs://b/x` into `gs:/b/x`) and never through TensorFlow's file system
(see `environment`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from etils import epath

from cairn.storage import environment, retries

PathLike = str | os.PathLike
Path = epath.Path
_URL = re.compile(r"^([a-z][a-z0-9+.\-]*)://", re.IGNORECASE)


def scheme(p: PathLike) -> str | None:
    """`'gs'` for `gs://b/x`, None for a local path."""
    m = _URL.match(os.fspath(p))
    return m.group(1).lower() if m else None


def is_url(p: PathLike) -> bool:
    """Whether `p` names an object store (`gs://`, `s3://`, ...), not a local file."""
    return scheme(p) is not None


def _configure_fsspec(url: str) -> None:
    environment.configure_environment()
    if scheme(url) in ("gs", "gcs"):
        # gcsfs's requests retried under the one retry budget. Only for gs://: gcsfs reads the
        # emulator's address (`STORAGE_EMULATOR_HOST`) when it is imported, so it must not be
        # imported by a `file://` access made before a test (or a user) points the process at one.
        retries.install_gcsfs()
    import fsspec.config

    options = environment.gcsfs_options()
    for protocol in ("gs", "gcs"):
        fsspec.config.conf[protocol] = {**fsspec.config.conf.get(protocol, {}), **options}


def path(p: PathLike) -> epath.Path:
    """`p` as an `epath.Path` (local or URL). Relative local paths stay relative."""
    if isinstance(p, epath.Path) and not is_url(p):
        return p
    if is_url(p):
        _configure_fsspec(os.fspath(p))
    return epath.Path(os.fspath(p))


def join(base: PathLike, *parts: str) -> str:
    """`base/part/...` as a string; URLs are joined with `/`, local paths with `os.path.join`."""
    b = os.fspath(base)
    if is_url(b):
        return "/".join([b.rstrip("/")] + [str(x).strip("/") for x in parts if str(x)])
    return os.path.join(b, *parts)


def absolute(p: PathLike, cwd: str | None = None) -> str:
    """A URL as given; a local path made absolute (against `cwd` when given)."""
    s = os.fspath(p)
    if is_url(s):
        return s
    s = os.path.expanduser(s)
    return os.path.abspath(os.path.join(cwd, s) if cwd else s)


def filesystem(p: PathLike) -> tuple[Any, str]:
    """`(fsspec filesystem, path within it)` for `p` (gcsfs with Cairn's options for gs://)."""
    import fsspec

    s = os.fspath(p)
    if is_url(s):
        _configure_fsspec(s)
        if scheme(s) in ("gs", "gcs"):
            return fsspec.core.url_to_fs(s, **environment.gcsfs_options())
        return fsspec.core.url_to_fs(s)
    return fsspec.filesystem("file"), os.path.abspath(s)


def sizes(directory: PathLike) -> dict[str, int]:
    """`{name: bytes}` of the files directly in `directory` (one listing; {} when it is absent)."""
    s = os.fspath(directory)
    if not is_url(s):
        try:
            with os.scandir(s) as it:
                return {e.name: e.stat().st_size for e in it if e.is_file()}
        except FileNotFoundError:
            return {}
    fs, inner = filesystem(s)
    try:
        entries = fs.ls(inner, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for e in entries:
        if e.get("type") == "file":
            out[e["name"].rstrip("/").rsplit("/", 1)[-1]] = int(e.get("size") or 0)
    return out
