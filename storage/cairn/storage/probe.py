"""Start-up checks: can this process write under a directory (local or in a bucket)?

Run before any training work, so a missing bucket, an unreachable endpoint, missing
credentials or a read-only location is one line naming the URL, not a failure minutes later
inside a checkpoint write.
"""

from __future__ import annotations

import os
import socket
import urllib.parse

from cairn.storage import environment
from cairn.storage.errors import StorageError
from cairn.storage.exclusive import remove
from cairn.storage.paths import PathLike, filesystem, is_url, join, scheme

GCS_ENDPOINT = "https://storage.googleapis.com"


def endpoint(p: PathLike) -> str:
    """The HTTP endpoint that serves `p` (the emulator when `STORAGE_EMULATOR_HOST` is set)."""
    if scheme(p) in ("gs", "gcs"):
        return environment.emulator_endpoint() or GCS_ENDPOINT
    return os.environ.get("AWS_ENDPOINT_URL", "https://s3.amazonaws.com")


def _reachable(url: str, timeout: float) -> str | None:
    """None when a TCP connection to `url`'s host opens within `timeout`, else why not."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def _describe(e: BaseException, url: str, bucket: str, where: str) -> str:
    text = str(e)
    if isinstance(e, FileNotFoundError):
        return f"{url}: bucket {bucket!r} does not exist (at {where})"
    if isinstance(e, PermissionError) or any(c in text for c in ("401", "403", "Forbidden", "Unauthorized")):
        return (
            f"{url}: no permission to write (at {where}); check the credentials "
            f"(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`) and the "
            f"bucket's IAM"
        )
    if "credential" in text.lower() or type(e).__name__ == "DefaultCredentialsError":
        return (
            f"{url}: no credentials for {where}: set GOOGLE_APPLICATION_CREDENTIALS or run "
            f"`gcloud auth application-default login`"
        )
    return f"{url}: cannot write ({type(e).__name__}: {text.splitlines()[0] if text else ''})"


def _check_local(d: str, what: str, probe_name: str) -> None:
    """An existing directory: a probe file is created and deleted in it. A missing one is not
    created: its nearest existing ancestor must be a directory this process may write."""
    try:
        if os.path.exists(d):
            probe = os.path.join(d, probe_name)
            with open(probe, "wb") as f:
                f.write(b"probe")
            os.unlink(probe)
            return
        ancestor = os.path.dirname(os.path.abspath(d))
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise NotADirectoryError(20, f"{ancestor} is not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise PermissionError(13, f"no permission to create directories in {ancestor}")
    except OSError as e:
        raise StorageError(f"{what}{d}: cannot write ({e.strerror or e})") from e


def check_writable(directory: PathLike, what: str = "directory", timeout: float = 10.0) -> None:
    """Raises `StorageError` (naming `directory` and what failed) unless a small object can be
    created and deleted under it; a missing local directory is not created (it must be
    creatable). The message starts with
    `what` (e.g. "model_dir") when given, then the path."""
    d = os.fspath(directory)
    what = f"{what} " if what else ""
    probe_name = f".cairn-write-probe-{socket.gethostname()}-{os.getpid()}"
    if not is_url(d):
        _check_local(d, what, probe_name)
        return
    where = endpoint(d)
    why = _reachable(where, timeout)
    if why:
        raise StorageError(f"{what}{d}: cannot reach the storage endpoint {where} ({why})")
    bucket = urllib.parse.urlsplit(d).netloc
    probe = join(d, probe_name)
    try:
        fs, inner = filesystem(probe)
        fs.pipe_file(inner, b"probe")
        remove(probe)
    except Exception as e:
        raise StorageError(f"{what}{_describe(e, d, bucket, where)}") from e
