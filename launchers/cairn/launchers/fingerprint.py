"""Run fingerprints: a header (config, data, seed, layout) and periodic parameter checksums.

A training run writes, next to its checkpoints,

```
<model_dir>/fingerprint/header.json      config_hash, data_fingerprint, seed, process/device counts, mesh
<model_dir>/fingerprint/checksums.jsonl  {"step", "param_sha256", "param_sum", "param_abs_sum"} per line
<model_dir>/fingerprint/batches.jsonl    {"step", "batch_sha256"}: the global batch the step trained on
```

so that two runs (another machine, another mesh, a resumed run) can be compared step by step
with `//launchers:verify` (see verify.py). JAX is imported only by the writing side.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn import storage
from cairn.evaluation import read_metrics

log = logging.getLogger("cairn.launchers")
PathLike = str | os.PathLike
FINGERPRINT_DIR = "fingerprint"
HEADER = "header.json"
CHECKSUMS = "checksums.jsonl"
BATCHES = "batches.jsonl"
SUPERSEDED_DIR = "superseded"  # cairn.trainer.history's: where a discarded timeline's lines go
HEADER_VERSION = 1

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _canonical(value: Any) -> Any:
    """`value` as plain JSON types, deterministically (keys as strings, sets sorted)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if hasattr(value, "to_dict") and callable(value.to_dict):  # ml_collections.ConfigDict
        value = value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_canonical(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, np.ndarray):
        return {"__ndarray__": str(value.dtype), "shape": list(value.shape), "values": value.tolist()}
    # A stable repr: the type's full name and its repr without memory addresses.
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return {"__repr__": kind, "value": _ADDRESS.sub("", repr(value))}


def canonical_json(config: Any) -> str:
    """The canonical JSON text of `config`: sorted keys, no whitespace, ASCII."""
    return json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(config: Mapping) -> str:
    """sha256 (hex) of the canonical JSON of `config`; equal for equal configs in any key order."""
    return hashlib.sha256(canonical_json(config).encode("ascii")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Checksum:
    """The parameters after `step` train steps."""

    step: int
    param_sha256: str
    param_sum: float
    param_abs_sum: float

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "param_sha256": self.param_sha256,
            "param_sum": self.param_sum,
            "param_abs_sum": self.param_abs_sum,
        }


def _host_array(leaf: Any) -> np.ndarray:
    """The whole of `leaf` as numpy; a collective (every process must call it) when the leaf is a
    global jax Array some of whose shards live on other processes."""
    import jax

    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(jax.device_get(leaf))


def params_checksum(step: int, params: Any) -> Checksum:
    """sha256 over the sorted flattened parameter paths, dtypes, shapes and raw bytes, plus the
    float64 sum and absolute sum of all values. A collective with several processes."""
    import jax

    leaves = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves.sort(key=lambda item: item[0])
    digest, total, abs_total = hashlib.sha256(), 0.0, 0.0
    for path, leaf in leaves:
        array = np.ascontiguousarray(_host_array(leaf))
        digest.update(f"{path}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
        values = array.astype(np.float64)
        total += float(values.sum())
        abs_total += float(np.abs(values).sum())
    return Checksum(int(step), digest.hexdigest(), total, abs_total)


class RunFingerprint:
    """Writes `<model_dir>/fingerprint/`: the header once, and a checksum line every
    `checksum_every` steps (0: never) from `step_hook` (pass it to `Trainer(step_hooks=[...])`).

    Call both methods on every process: only process 0 writes, but the checksum is a collective
    when parameters are sharded across processes."""

    def __init__(self, model_dir: str, checksum_every: int = 10):
        if isinstance(checksum_every, bool) or not isinstance(checksum_every, int) or checksum_every < 0:
            raise ValueError(f"RunFingerprint.checksum_every must be an int >= 0, got {checksum_every!r}")
        self.model_dir = os.fspath(model_dir)
        self.directory = storage.join(self.model_dir, FINGERPRINT_DIR)
        self.checksum_every = checksum_every
        self._files: dict = {}

    @staticmethod
    def _is_writer() -> bool:
        import jax

        return jax.process_index() == 0

    def write_header(
        self,
        *,
        config_hash: str,
        data_fingerprint: str,
        seed: int,
        process_count: int,
        device_count: int,
        mesh: Mapping[str, int],
    ) -> None:
        """Writes header.json atomically (process 0). A resumed run rewrites it; a changed config
        hash or data fingerprint is logged as a warning."""
        if not self._is_writer():
            return
        import jax

        header = {
            "version": HEADER_VERSION,
            "config_hash": str(config_hash),
            "data_fingerprint": str(data_fingerprint),
            "seed": int(seed),
            "process_count": int(process_count),
            "device_count": int(device_count),
            "mesh": {str(k): int(v) for k, v in dict(mesh).items()},
            "jax_version": jax.__version__,
            "platform": jax.default_backend(),
        }
        path = storage.join(self.directory, HEADER)
        try:
            old = storage.read_json(path)
        except (OSError, ValueError):
            old = {}
        if old:
            for key in ("config_hash", "data_fingerprint"):
                if key in old and old[key] != header[key]:
                    log.warning(
                        "%s: %s changed from %s to %s (a resumed run with another %s)",
                        path,
                        key,
                        old[key],
                        header[key],
                        key.split("_")[0],
                    )
        storage.write_text(path, json.dumps(header, sort_keys=True, indent=1) + "\n")

    def supersede_after(self, step: int) -> int:
        """Moves the checksum and batch lines after `step` (a discarded timeline's, when a run
        resumes at `step`) to `<model_dir>/superseded/fingerprint/` (process 0), as the trainer
        does with the summaries (`cairn.trainer.history`). Returns the number of lines moved."""
        if not self._is_writer():
            return 0
        aside = storage.join(self.model_dir, SUPERSEDED_DIR, FINGERPRINT_DIR)
        return sum(
            storage.supersede_after(storage.join(self.directory, name), step, storage.join(aside, name))
            for name in (CHECKSUMS, BATCHES)
        )

    def step_hook(self, step: int, state: Any) -> None:
        """Every `checksum_every` steps: checksums `state.params` (collective) and appends a line."""
        if not self.checksum_every or step % self.checksum_every != 0:
            return
        checksum = params_checksum(step, state.params)
        if self._is_writer():
            self.append(checksum)

    def batch_hook(self, step: int, digests: Any) -> None:
        """Records the fingerprint of the global batch of `step` (pass it to
        `Trainer(batch_hooks=[...], batch_hook_every=checksum_every)`; `digests` is a
        `cairn.partitioning.GatheredDigests`)."""
        if self.checksum_every and self._is_writer():
            self._append_line(BATCHES, {"step": int(step), "batch_sha256": digests.fingerprint()})

    def append(self, checksum: Checksum) -> None:
        """Appends one line to checksums.jsonl, flushed and fsynced."""
        self._append_line(CHECKSUMS, checksum.to_json())

    def _append_line(self, name: str, row: Mapping[str, Any]) -> None:
        """Appends (fsynced) locally; one whole part object per line at a URL."""
        if name not in self._files:
            self._files[name] = storage.JsonLinesWriter(storage.join(self.directory, name), fsync=True)
        self._files[name].append([row], flush=True)


# -- reading ------------------------------------------------------------------------------


class FingerprintError(ValueError):
    """A run directory that cannot be compared (missing, or without a fingerprint)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run left behind: its header, train losses, checksums and global batch
    fingerprints by step."""

    model_dir: str
    header: Mapping[str, Any]
    losses: Mapping[int, float]
    checksums: Mapping[int, Checksum]
    skipped_lines: int = 0  # unreadable lines other than a truncated last line
    batches: Mapping[int, str] = dataclasses.field(default_factory=dict)


def load_run(model_dir: PathLike, metric: str = "loss") -> Run:
    """Reads `<model_dir>/fingerprint/` and the train `metric` of `<model_dir>/summaries/metrics.jsonl`.
    A step's last row wins (a resumed run recomputes steps after its checkpoint).

    Raises `FingerprintError` naming the path when the directory or the header is missing."""
    root = os.fspath(model_dir)
    if not storage.path(root).is_dir():
        raise FingerprintError(f"run directory {root} does not exist")
    header_path = storage.join(root, FINGERPRINT_DIR, HEADER)
    try:
        header = storage.read_json(header_path)
    except FileNotFoundError:
        raise FingerprintError(
            f"{header_path} not found: {root} has no run fingerprint "
            "(train with the fingerprint step hook to write one)"
        ) from None
    except ValueError as e:
        raise FingerprintError(f"{header_path} is not valid JSON: {e}") from None
    rows, bad_metrics = read_metrics(storage.join(root, "summaries"))
    losses: dict = {}
    for row in rows:
        if row.get("task") == "train" and row.get("metric") == metric and "step" in row:
            value = row.get("value")
            losses[int(row["step"])] = float(value) if value is not None else math.nan
    checks, bad_checks = storage.read_json_lines(storage.join(root, FINGERPRINT_DIR, CHECKSUMS))
    checksums: dict = {}
    for row in checks:
        try:
            c = Checksum(
                int(row["step"]), str(row["param_sha256"]), float(row["param_sum"]), float(row["param_abs_sum"])
            )
        except (KeyError, TypeError, ValueError):
            bad_checks += 1
            continue
        checksums[c.step] = c
    batch_rows, bad_batches = storage.read_json_lines(storage.join(root, FINGERPRINT_DIR, BATCHES))
    batches: dict = {}
    for row in batch_rows:
        try:
            batches[int(row["step"])] = str(row["batch_sha256"])
        except (KeyError, TypeError, ValueError):
            bad_batches += 1
    return Run(
        root,
        header,
        dict(sorted(losses.items())),
        dict(sorted(checksums.items())),
        bad_metrics + bad_checks + bad_batches,
        dict(sorted(batches.items())),
    )


def header_summary(run: Run) -> str:
    h = run.header
    return (
        f"config {str(h.get('config_hash', '?'))[:12]}, data {str(h.get('data_fingerprint', '?'))[:12]}, "
        f"seed {h.get('seed', '?')}, {h.get('process_count', '?')} process(es), "
        f"{h.get('device_count', '?')} device(s), mesh {h.get('mesh', '?')}"
    )


__all__ = [
    "Checksum",
    "FingerprintError",
    "Run",
    "RunFingerprint",
    "canonical_json",
    "config_hash",
    "header_summary",
    "load_run",
    "params_checksum",
]
