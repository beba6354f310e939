"""What each host feeds: per-row digests of host batches, gathered across processes.

Two uses: the check that hosts of one data-parallel replica feed identical rows (a host
that reads the wrong rows shrinks the global batch without any error), and a fingerprint of
the global batch that does not depend on how many hosts read it (rows are hashed one by one
and joined in global row order).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from cairn.partitioning.data_layout import DataLayout

_WORDS = 8  # a sha256 digest as int32 words


class ReplicaBatchMismatchError(RuntimeError):
    """Hosts of one data-parallel replica fed different rows."""


def row_digests(host_batch: Mapping[str, Any]) -> np.ndarray:
    """`[rows, 32]` uint8: the sha256 of each row over the batch's features (sorted by name;
    name, dtype, per-row shape and bytes)."""
    names = sorted(host_batch)
    arrays = [np.ascontiguousarray(np.asarray(host_batch[n])) for n in names]
    rows = {a.shape[0] for a in arrays}
    if len(rows) != 1:
        raise ValueError(f"batch features have different row counts: {dict(zip(names, [a.shape for a in arrays]))}")
    out = np.empty((rows.pop(), 32), np.uint8)
    for i in range(out.shape[0]):
        h = hashlib.sha256()
        for name, a in zip(names, arrays):
            h.update(f"{name}|{a.dtype.str}|{a.shape[1:]}|".encode())
            h.update(a[i].tobytes())
        out[i] = np.frombuffer(h.digest(), np.uint8)
    return out


@dataclasses.dataclass(frozen=True)
class GatheredDigests:
    """Every process's data shard id and row digests (`digests[p]` is `[rows, 32]` uint8)."""

    shard_ids: np.ndarray
    num_shards: int
    digests: np.ndarray

    def mismatches(self) -> list[tuple[int, list[int]]]:
        """`(shard, processes)` for each shard whose processes fed different rows."""
        bad = []
        for shard in sorted(set(self.shard_ids.tolist())):
            procs = [int(p) for p in np.nonzero(self.shard_ids == shard)[0]]
            first = self.digests[procs[0]]
            if any(not np.array_equal(first, self.digests[p]) for p in procs[1:]):
                bad.append((shard, procs))
        return bad

    def check(self, step: int) -> None:
        """Raises `ReplicaBatchMismatchError` naming the processes and the step when hosts of one
        replica fed different rows."""
        bad = self.mismatches()
        if not bad:
            return
        shard, procs = bad[0]
        groups: dict[str, list[int]] = {}
        for p in procs:
            groups.setdefault(hashlib.sha256(self.digests[p].tobytes()).hexdigest()[:12], []).append(p)
        detail = "; ".join(f"processes {ps} fed rows {h}" for h, ps in groups.items())
        raise ReplicaBatchMismatchError(
            f"step {step}: processes {procs} hold data shard {shard} of {self.num_shards} (one data-parallel "
            f"replica) but fed different rows ({detail}); every host of a replica must read the rows of its "
            f"DataLayout shard"
        )

    def fingerprint(self) -> str:
        """sha256 (hex) of the global batch: the row digests joined in global row order, the same
        for any number of hosts or shards."""
        h = hashlib.sha256()
        for shard in range(self.num_shards):
            proc = int(np.nonzero(self.shard_ids == shard)[0][0])
            h.update(self.digests[proc].tobytes())
        return h.hexdigest()


def gather_row_digests(host_batch: Mapping[str, Any], layout: DataLayout) -> GatheredDigests:
    """Every process's row digests and shard id. A collective when there are several processes
    (every process must call it at the same point)."""
    mine = row_digests(host_batch)
    if jax.process_count() == 1:
        return GatheredDigests(np.array([layout.shard_id]), layout.num_shards, mine[None])
    from jax.experimental import multihost_utils

    words = mine.view(np.int32).reshape(-1)  # [rows * 8]
    payload = np.concatenate([np.array([layout.shard_id, layout.num_shards], np.int32), words])
    gathered = np.asarray(multihost_utils.process_allgather(payload))  # [processes, 2 + rows * 8]
    if len(set(gathered[:, 1].tolist())) != 1:
        raise ReplicaBatchMismatchError(f"processes disagree on the number of data shards: {gathered[:, 1].tolist()}")
    digests = np.ascontiguousarray(gathered[:, 2:]).view(np.uint8).reshape(gathered.shape[0], -1, 32)
    return GatheredDigests(gathered[:, 0].copy(), int(gathered[0, 1]), digests)


def check_replica_batches(host_batch: Mapping[str, Any], layout: DataLayout, step: int) -> GatheredDigests:
    """Gathers the row digests and checks that processes with the same `shard_id` agree
    (`ReplicaBatchMismatchError` otherwise). Returns the gathered digests."""
    gathered = gather_row_digests(host_batch, layout)
    gathered.check(step)
    return gathered
