"""Packing plans stored beside the cache: built once, by one process under a lock, then
memory-mapped by every later start on every host.

A plan depends on the cached lengths, the task's preprocessors and features, the sequence
lengths, the feature converter, the packing mode and window, and the base order (the cache
order under the chunk read order; the seeded permutation under the global one). `plan_key`
hashes all of them; the plan lives at

    <task cache>/plans/<key>.json          num_bins, the arrays' sizes and SHA-256s (written last)
    <task cache>/plans/<key>.starts.npy    int64 [num_bins + 1]
    <task cache>/plans/<key>.order.npy     the first-fit order (first-fit plans only)

`load_or_build` reads a stored plan (O(1): its JSON and the arrays' headers; the arrays are
memory-mapped, at a URL copied once per host by content, as `lengths.npy` is), or takes the
lock `<key>.lock` (create-if-absent, on a bucket too), builds the plan, writes it and releases
the lock. A process that finds the lock taken waits for the plan; a lock older than
`LOCK_STALE_S` (its holder died) is removed and taken again. A damaged plan (an array missing,
or of another size than its record says) is built and written again. Where the cache cannot be written
(a read-only bucket), the plan is built and kept in memory with a one-line notice.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cairn import storage
from cairn.datatasks.deterministic import fingerprint as fp
from cairn.datatasks.deterministic.cached_task import CachedTask
from cairn.datatasks.deterministic.plan import Plan
from cairn.datatasks.deterministic.store import load_npy

PLANS = "plans"
PLAN_FORMAT = 1
LOCK_STALE_S = 3600.0  # a lock this old was left by a process that died
WAIT_S = 1800.0  # the longest a process waits for another's plan before building its own
POLL_S = 0.5
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _converter_description(converter: Any) -> dict[str, Any]:
    """The converter's class and settings (no memory addresses)."""
    settings = {k: _ADDRESS.sub("", repr(v)) for k, v in sorted(vars(converter).items())}
    return {"class": f"{type(converter).__module__}.{type(converter).__qualname__}", "settings": settings}


def plan_key(
    cache: CachedTask,
    task: Any,
    split: str,
    converter: Any,
    sequence_length: Mapping[str, int],
    capacity: np.ndarray,
    packing: str,
    packing_window: int,
    base: Mapping[str, Any],
) -> str:
    """SHA-256 of everything the plan depends on (module docstring); `base` describes the base
    order (`{"order": "cache"}` or `{"order": "global", "seed": s}`)."""
    parts = fp.task_fingerprint(task, split, with_source=False)
    payload = {
        "plan_format": PLAN_FORMAT,
        "lengths_sha256": cache.info["lengths"].get("sha256"),
        "num_records": cache.num_records,
        "length_features": cache.length_features,
        "preprocessors": parts.get("preprocessors"),
        "features": parts.get("features"),
        "sequence_length": {k: int(v) for k, v in sorted(sequence_length.items())},
        "converter": _converter_description(converter),
        "capacity": np.asarray(capacity).astype(int).tolist(),
        "packing": packing,
        "packing_window": int(packing_window) if packing == "first_fit" else 0,
        "base": dict(base),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array))
    return buf.getvalue()


def _arrays(plan: Plan) -> dict[str, np.ndarray]:
    out = {"starts": np.asarray(plan.starts, np.int64)}
    if plan.order is not None:
        out["order"] = np.asarray(plan.order)
    return out


def _read(folder: str, key: str) -> Plan | None:
    """The stored plan `key`, memory-mapped, or None when there is none (or it is damaged:
    an array missing or of another size than its record says; it is then rebuilt)."""
    record_path = storage.join(folder, f"{key}.json")
    if not storage.path(record_path).exists():
        return None
    try:
        record = json.loads(storage.read_text(record_path))
        sizes = storage.sizes(folder)
        arrays = {}
        for name, meta in sorted(record["arrays"].items()):
            if sizes.get(meta["file"]) != int(meta["bytes"]):
                return None
            arrays[name] = load_npy(storage.join(folder, meta["file"]), meta["sha256"])
        if arrays["starts"].shape != (int(record["num_bins"]) + 1,):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Plan(int(record["num_bins"]), arrays["starts"], arrays.get("order"))


def _write(folder: str, key: str, plan: Plan, describe: Mapping[str, Any]) -> None:
    """The arrays first, then the JSON that names them (create-if-absent: the commit point)."""
    record: dict[str, Any] = {"plan_format": PLAN_FORMAT, "key": key, "num_bins": plan.num_bins, "arrays": {}}
    for name, array in _arrays(plan).items():
        data = _npy_bytes(array)
        file = f"{key}.{name}.npy"
        storage.write_bytes(storage.join(folder, file), data)
        record["arrays"][name] = {"file": file, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    record["describe"] = dict(describe)
    storage.create_exclusive(storage.join(folder, f"{key}.json"), json.dumps(record, sort_keys=True, indent=1).encode())


def _take_lock(lock: str) -> bool:
    """Creates the lock (True), or False when a live process holds it; a stale lock is removed
    and taken."""
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
    if storage.create_exclusive(lock, json.dumps(owner).encode()):
        return True
    try:
        held = json.loads(storage.read_text(lock))
        stale = time.time() - float(held.get("time", 0.0)) > LOCK_STALE_S
    except (OSError, ValueError, TypeError, AttributeError):
        stale = False  # being written, or just removed: not ours to judge
    if stale:
        storage.remove(lock)
        return storage.create_exclusive(lock, json.dumps(owner).encode())
    return False


def load_or_build(
    cache: CachedTask, key: str, build: Callable[[], Plan], describe: Mapping[str, Any] | None = None
) -> tuple[Plan, str]:
    """The stored plan `key` of `cache`, or one built by `build()` (and stored, under a lock).
    Returns `(plan, how)`, `how` being "stored" (read), "built" (built and stored here) or
    "memory" (built, not stored: the cache is not writable)."""
    folder = storage.join(cache.path, PLANS)
    found = _read(folder, key)
    if found is not None:
        return found, "stored"
    lock = storage.join(folder, f"{key}.lock")
    try:
        if not storage.is_url(folder):
            os.makedirs(folder, exist_ok=True)
        waited = 0.0
        while not _take_lock(lock):
            if waited >= WAIT_S:  # another process is slow: build here, keep it in memory
                return build(), "memory"
            time.sleep(POLL_S)
            waited += POLL_S
            found = _read(folder, key)
            if found is not None:
                return found, "stored"
    except OSError as e:
        print(f"cairn: packing plan kept in memory: cannot write under {folder} ({e})", file=sys.stderr)
        return build(), "memory"
    try:
        found = _read(folder, key)  # written while this process waited for the lock
        if found is not None:
            return found, "stored"
        record = storage.join(folder, f"{key}.json")
        if storage.path(record).exists():  # damaged (an array missing or cut): written again
            storage.remove(record)
        plan = build()
        try:
            _write(folder, key, plan, describe or {})
        except OSError as e:
            print(f"cairn: packing plan kept in memory: cannot write under {folder} ({e})", file=sys.stderr)
            return plan, "memory"
        stored = _read(folder, key)
        return (stored, "built") if stored is not None else (plan, "memory")
    finally:
        try:
            storage.remove(lock)
        except OSError:
            pass
