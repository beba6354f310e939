"""One writer per model_dir: a lock file holding the owner's pid, host and start time.

The lock is created atomically if absent (`cairn.storage.create_exclusive`): a hard link
locally, an upload with the precondition `ifGenerationMatch=0` on a bucket, so two runs
started at once cannot both take it, on local disk or in `gs://`. A caller that writes into
model_dir before training (the train launcher's `config.json`) takes the lock first and hands
it to `Trainer.train(model_dir_lock=...)`."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from cairn import storage
from cairn.partitioning import peer_watchdog

LOCK_NAME = "cairn.lock"
log = logging.getLogger(__name__)


class ModelDirLockedError(RuntimeError):
    """Another live process is writing this model_dir."""


def _age(owner: dict) -> str:
    started = owner.get("time")
    if not isinstance(started, (int, float)):
        return "age unknown"
    seconds = max(0, int(time.time() - started))
    hours, rest = divmod(seconds, 3600)
    return f"taken {f'{hours}h ' if hours else ''}{rest // 60}m {rest % 60}s ago"


def locked_error(model_dir: str, path: str, owner: dict) -> ModelDirLockedError:
    """The one-line refusal naming the holder's host, pid and the lock's age."""
    return ModelDirLockedError(
        f"model_dir {model_dir} is in use by pid {owner.get('pid')} on host {owner.get('host')} "
        f"({_age(owner)}; lock file {path}); two runs must not write one model_dir. If that process "
        f"is gone, delete the lock file."
    )


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
        self.model_dir = os.fspath(model_dir)
        self.path = storage.join(self.model_dir, LOCK_NAME)
        self._held = False
        self._unhook: Any = None

    def acquire(self) -> ModelDirLock:
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for attempt in range(20):
            if not storage.create_exclusive(self.path, json.dumps({**me, "time": time.time()}).encode()):
                owner = self._owner()
                if owner is None:  # being written, removed meanwhile, or left empty by a kill
                    if attempt < 10:
                        time.sleep(0.05)
                        continue
                    owner = {"pid": -1, "host": me["host"]}
                if owner.get("host") != me["host"] or _alive(int(owner.get("pid", -1))):
                    raise locked_error(self.model_dir, self.path, owner) from None
                log.warning("taking over the stale lock %s of dead pid %s", self.path, owner.get("pid"))
                storage.remove(self.path)
                continue
            self._held = True
            # a watchdog that stops the job for a lost peer exits at once: it releases the lock first
            self._unhook = peer_watchdog.on_stop(self.release)
            return self
        raise ModelDirLockedError(f"could not take the lock {self.path}")

    def check_free(self) -> None:
        """Raises `ModelDirLockedError` when a live run holds the lock (a look, not a claim: call
        before writing anything into model_dir; `acquire` still decides)."""
        owner = self._owner()
        if owner is None:
            return
        if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", -1))):
            raise locked_error(self.model_dir, self.path, owner)

    def _owner(self):
        try:
            return storage.read_json(self.path)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    @property
    def held(self) -> bool:
        """True between a successful `acquire` and `release`."""
        return self._held

    def release(self) -> None:
        if self._unhook is not None:
            self._unhook, unhook = None, self._unhook
            unhook()
        if self._held:
            owner = self._owner()
            if owner and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                storage.remove(self.path)
            self._held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
