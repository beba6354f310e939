"""A model function over a list of examples, in global batches sharded over the mesh, on one
process or many.

Every process holds the same examples (an Evaluator's, infer's inputs) and calls a
`ShardedBatches` with all of them. For each global batch (the last one padded with masked zero
rows), a process feeds only the rows of its `partitioner.data_layout()` shard, the jitted
function runs with the batch split over the mesh's data-parallel axes, and its outputs come
back replicated: every process gets every row's output, in input order, the padding dropped.
Every process therefore runs the same collectives, and computes the same numbers as one
process would with the same mesh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

log = logging.getLogger(__name__)


def _param_shardings(partitioner: Any, params: Any) -> Any:
    """Each param's own sharding where it lies on the partitioner's mesh, else replicated."""
    replicated = NamedSharding(partitioner.mesh, PartitionSpec())

    def one(x):
        s = getattr(x, "sharding", None)
        return s if isinstance(s, NamedSharding) and s.mesh == partitioner.mesh else replicated

    return jax.tree.map(one, params)


class ShardedBatches:
    """`fn(params, batch) -> outputs` over many examples, `batch_size` rows at a time.

    Row `i` of a global batch sits at position `i` of the array the mesh computes on, whatever
    the number of processes, so sampled decodes are the same on any host count for the same
    data-parallel device count. The array has `batch_size` rounded up to a multiple of the
    data-parallel devices rows; the rows past the examples (that rounding, the last batch's
    missing rows) are zeros, and their outputs are dropped.

    Args:
      partitioner: the run's `Partitioner`.
      fn: a jittable function of the params and a batch (a pytree of `[rows, ...]` arrays)
        returning a pytree of `[rows, ...]` arrays.
      batch_size: examples per global batch (check it first with `run_spec.bind(padded=...)` where
        the user chose it).
      what: the verb of the per-batch log line ("decodes", "scores").
      log_level: the level of that line (one per batch on every process).
    """

    def __init__(
        self,
        partitioner: Any,
        fn: Callable[[Any, Any], Any],
        batch_size: int,
        what: str = "computes",
        log_level: int = logging.INFO,
    ):
        shards = partitioner.batch_parts()
        self.partitioner = partitioner
        self.fn = fn
        self.batch_size = max(1, int(batch_size))
        self.padded_size = -(-self.batch_size // shards) * shards
        self.what = what
        self.log_level = log_level
        self._rows = partitioner.data_layout().host_rows(self.padded_size)
        self._compiled: dict = {}

    def _jitted(self, param_sh: Any, batch: Any) -> Callable:
        batch_sh = jax.tree.map(lambda x: x.sharding, batch)
        key = (
            jax.tree.structure(param_sh),
            tuple(jax.tree.leaves(param_sh)),
            jax.tree.structure(batch_sh),
            tuple(jax.tree.leaves(batch_sh)),
        )
        if key not in self._compiled:
            replicated = NamedSharding(self.partitioner.mesh, PartitionSpec())
            self._compiled[key] = self.partitioner.partition(
                self.fn, in_shardings=(param_sh, batch_sh), out_shardings=replicated
            )
        return self._compiled[key]

    def __call__(self, params: Any, features: Any, first_index: int = 0, total: int | None = None) -> Any:
        """The outputs of every row of `features` (a pytree of arrays with the same number of
        rows, at least one), as numpy arrays in row order, identical on every process.
        `first_index` and `total` only number the rows in the log line (e.g. a chunk's rows
        within all examples)."""
        n = len(jax.tree.leaves(features)[0])
        if n < 1:
            raise ValueError("ShardedBatches needs at least one row")
        total = n if total is None else total
        param_sh = _param_shardings(self.partitioner, params)
        params = jax.device_put(params, param_sh)
        outputs = []
        batches = -(-n // self.batch_size)
        for b, start in enumerate(range(0, n, self.batch_size)):
            real = min(self.batch_size, n - start)
            lo, hi = min(real, self._rows.start), min(real, self._rows.stop)  # this host's examples

            def rows(x, first=start + lo, last=start + hi):
                x = np.asarray(x[first:last])
                pad = self._rows.stop - self._rows.start - len(x)
                return np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]) if pad else x

            batch = self.partitioner.shard_batch(jax.tree.map(rows, features))
            self._log(b, batches, start + lo, start + hi, first_index, total)
            out = self._jitted(param_sh, batch)(params, batch)
            outputs.append(jax.tree.map(lambda y, real=real: np.asarray(y.addressable_data(0))[:real], out))
        return jax.tree.map(lambda *ys: np.concatenate(ys), *outputs)

    def _log(self, b: int, batches: int, lo: int, hi: int, first: int, total: int) -> None:
        who = f"process {jax.process_index()}/{jax.process_count()}"
        where = f" (batch {b + 1}/{batches})" if batches > 1 else ""
        if lo < hi:
            log.log(
                self.log_level, "%s %s rows %d-%d of %d%s", who, self.what, first + lo, first + hi - 1, total, where
            )
        else:
            log.log(self.log_level, "%s %s no rows of %d (padding only)%s", who, self.what, total, where)
