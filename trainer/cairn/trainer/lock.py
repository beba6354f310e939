"""One writer per model_dir: a lock file holding the owner's pid and host."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

LOCK_NAME = "cairn.lock"
log = logging.getLogger(__name__)


class ModelDirLockedError(RuntimeError):
    """Another live process is writing this model_dir."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ModelDirLock:
    """`<model_dir>/cairn.lock`, created exclusively. A lock left by a dead process on this host
    (a crash, SIGKILL) is taken over with a warning; a live owner raises `ModelDirLockedError`.
    Locks from another host are trusted (delete the file if that host is gone)."""

    def __init__(self, model_dir: str | os.PathLike):
        self.path = Path(model_dir) / LOCK_NAME
        self._held = False

    def acquire(self) -> "ModelDirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for attempt in range(20):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is None:  # being written, removed meanwhile, or left empty by a kill
                    if attempt < 10:
                        time.sleep(0.05)
                        continue
                    owner = {"pid": -1, "host": me["host"]}
                if owner.get("host") != me["host"] or _alive(int(owner.get("pid", -1))):
                    raise ModelDirLockedError(
                        f"model_dir {self.path.parent} is in use by pid {owner.get('pid')} on host "
                        f"{owner.get('host')} (lock file {self.path}); two runs must not write one model_dir. "
                        f"If that process is gone, delete the lock file.") from None
                log.warning("taking over the stale lock %s of dead pid %s", self.path, owner.get("pid"))
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return self
        raise ModelDirLockedError(f"could not take the lock {self.path}")

    def _owner(self):
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def release(self) -> None:
        if self._held:
            owner = self._owner()
            if owner and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
