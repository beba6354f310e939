"""Checkpoint manifests: size and SHA-256 of every file of a checkpoint, read in 1 MiB chunks
(hashlib releases the GIL, so a thread pool hashes several files at once).

A manifest is `{"files": {relative path: {"size": bytes, "sha256": hex}}}`; a manifest of the
older layout (`{relative path: bytes}`) is read as sizes only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cairn import storage

MANIFEST_DIR = "manifests"  # <model_dir>/manifests/<step>.json
CHUNK = 1 << 20
WORKERS = min(8, os.cpu_count() or 1)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    if storage.is_url(path):
        fs, inner = storage.filesystem(path)
        opener: Any = fs.open(inner, "rb")
    else:
        opener = open(path, "rb")
    with opener as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(root: storage.PathLike) -> dict[str, dict[str, Any]]:
    """`{relative path: {"size", "sha256"}}` of every file under `root` ({} when absent)."""
    sizes = storage.file_sizes(root)
    base = os.fspath(root)
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="cairn-checksum") as pool:
        digests = pool.map(lambda name: _sha256(storage.join(base, name)), list(sizes))
        return {name: {"size": size, "sha256": d} for (name, size), d in zip(sizes.items(), digests)}


def manifest(root: storage.PathLike) -> dict[str, Any]:
    """The manifest of the finished checkpoint at `root`."""
    return {"files": file_checksums(root)}


def last_good_step(model_dir: storage.PathLike, other_than: int | None = None) -> int | None:
    """The latest step of `model_dir` with a manifest (a finished save), other than `other_than`."""
    names = storage.sizes(storage.join(os.fspath(model_dir), MANIFEST_DIR))
    steps = [int(n[: -len(".json")]) for n in names if n.endswith(".json") and n[: -len(".json")].isdigit()]
    return max((s for s in steps if s != other_than), default=None)


def expected_files(saved: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`{relative path: {"size"[, "sha256"]}}` of a manifest in either layout."""
    files = saved.get("files")
    if isinstance(files, dict):
        return {k: dict(v) for k, v in files.items()}
    return {k: {"size": v} for k, v in saved.items()}


def mismatches(root: storage.PathLike, saved: Mapping[str, Any]) -> list[str]:
    """One description per file under `root` that differs from the manifest `saved` (missing,
    another size, other bytes), in path order; [] when all match."""
    expected = expected_files(saved)
    actual = storage.file_sizes(root)
    bad = []
    to_hash = []
    for name, want in expected.items():
        size = actual.get(name)
        if size is None:
            bad.append((name, f"{name} (missing)"))
        elif size != want["size"]:
            bad.append((name, f"{name} ({size} bytes, expected {want['size']})"))
        elif "sha256" in want:
            to_hash.append(name)
    base = os.fspath(root)
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="cairn-checksum") as pool:
        digests = pool.map(lambda name: _sha256(storage.join(base, name)), to_hash)
        for name, digest in zip(to_hash, digests):
            if digest != expected[name]["sha256"]:
                bad.append((name, f"{name} (same size, other bytes: SHA-256 differs)"))
    return [text for _, text in sorted(bad)]
