"""The Partitioner: a mesh plus logical axis rules, turned into shardings and jitted functions."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cairn.partitioning import platform
from cairn.partitioning.data_layout import DataLayout, data_layout
from cairn.partitioning.opt_state import opt_state_shardings
from cairn.partitioning.rules import LogicalAxisRules, LogicalSpec, logical_to_mesh_spec
from cairn.partitioning.tree import map_specs

_ACTIVE: contextvars.ContextVar[Partitioner | None] = contextvars.ContextVar("cairn_partitioner", default=None)


def current_partitioner() -> Partitioner | None:
    """The partitioner whose activation rules are in force (inside `Partitioner.activated()`,
    e.g. while a `Partitioner.partition` function is traced), else None. Model code asks it
    how to constrain activations by logical names (`Partitioner.constrain`)."""
    return _ACTIVE.get()


class PartitionedFunction:
    """A jitted function that runs, and lowers, with its mesh set and its partitioner's
    activation rules in force (`Partitioner.activated`); `jitted` is the `jax.jit`."""

    def __init__(self, fn: Callable, jitted: Any, mesh: Mesh, partitioner: Partitioner | None = None):
        functools.update_wrapper(self, fn)
        self.jitted = jitted
        self.mesh = mesh
        self.partitioner = partitioner

    def _context(self) -> contextlib.AbstractContextManager:
        return self.partitioner.activated() if self.partitioner is not None else contextlib.nullcontext()

    def __call__(self, *args, **kw):
        with jax.set_mesh(self.mesh), self._context(), platform.for_devices(self.mesh.devices.flat):
            return self.jitted(*args, **kw)

    def lower(self, *args, **kw):
        """`jax.jit(...).lower` with the mesh set (traced for the mesh's platform: a described
        TPU slice's programs are built for TPU, `platform.for_devices`)."""
        with jax.set_mesh(self.mesh), self._context(), platform.for_devices(self.mesh.devices.flat):
            return self.jitted.lower(*args, **kw)


class Partitioner:
    """Maps logical specs to `NamedSharding`s on `mesh` with `rules`, and jits with them.

    Args:
      mesh: from `create_mesh`.
      rules: e.g. `standard_logical_axis_rules()`.
      on_indivisible: 'replicate' (default: an indivisible dimension falls to the next rule,
        or is replicated with an `IndivisibleDimensionWarning` naming the parameter) or
        'error' (raise `IndivisibleDimensionError`).
      batch_spec: the logical names of a batch array's leading dimensions.
      constrain_activations: whether `constrain` (model code's activation constraints, while
        a partitioned function is traced) constrains; False leaves activations to GSPMD.
    """

    def __init__(
        self,
        mesh: Mesh,
        rules: LogicalAxisRules,
        on_indivisible: str = "replicate",
        batch_spec: Sequence[str | None] = ("batch",),
        constrain_activations: bool = True,
    ):
        self.mesh = mesh
        self.rules = tuple((name, axes) for name, axes in rules)
        self.on_indivisible = on_indivisible
        self.batch_spec = tuple(batch_spec)
        self.constrain_activations = constrain_activations

    def __repr__(self) -> str:
        return f"Partitioner(mesh={dict(self.mesh.shape)}, rules={list(self.rules)})"

    # -- specs and shardings -------------------------------------------------------------
    def mesh_spec(self, spec: LogicalSpec, shape: Sequence[int] | None = None, path: str = "<array>") -> PartitionSpec:
        """The mesh `PartitionSpec` of one logical spec (divisibility checked if `shape`)."""
        return logical_to_mesh_spec(spec, self.rules, self.mesh.shape, shape, path, self.on_indivisible)

    def sharding(self, spec: LogicalSpec, shape: Sequence[int] | None = None, path: str = "<array>") -> NamedSharding:
        """The `NamedSharding` of one logical spec."""
        return NamedSharding(self.mesh, self.mesh_spec(spec, shape, path))

    def shardings_for(self, specs: Any, shapes: Any = None) -> Any:
        """`NamedSharding`s for a pytree of logical specs (tuples of names or PartitionSpecs).

        `shapes`, a parallel tree of arrays or `jax.ShapeDtypeStruct`s, enables the
        divisibility check; errors and warnings name each array by its tree path.
        """
        if shapes is None:
            return map_specs(lambda path, s: self.sharding(s, None, path), specs)
        return map_specs(lambda path, s, x: self.sharding(s, np.shape(x), path), specs, shapes)

    def opt_state_shardings(self, params: Any, param_specs: Any, opt_state: Any) -> Any:
        """Shardings for an optimizer state (shapes or arrays): leaves shaped like their param
        follow it, factored statistics keep the dimensions they keep (`opt_state_logical_specs`);
        indivisible dimensions are replicated quietly (the params already warned)."""
        return opt_state_shardings(self, params, param_specs, opt_state)

    # -- functions -----------------------------------------------------------------------
    def _to_sharding(self, tree: Any) -> Any:
        def convert(x):
            if isinstance(x, PartitionSpec):
                return NamedSharding(self.mesh, x)
            return x

        return jax.tree.map(convert, tree, is_leaf=lambda x: isinstance(x, PartitionSpec))

    def partition(
        self,
        fn: Callable,
        in_shardings: Any = None,
        out_shardings: Any = None,
        donate_argnums: Sequence[int] = (),
        static_argnums: Sequence[int] = (),
        compiler_options: Mapping[str, Any] | None = None,
    ) -> PartitionedFunction:
        """`jax.jit(fn)` with these shardings (trees of `NamedSharding`, mesh `PartitionSpec`s,
        or None to let GSPMD choose). Calls and `.lower` run with this mesh set.
        `compiler_options`: XLA flags for this program's compile (`jax.jit`'s), e.g.
        `{"xla_tpu_scheduler_percent_shared_memory_limit": 50}`."""
        kwargs: dict[str, Any] = {"donate_argnums": tuple(donate_argnums), "static_argnums": tuple(static_argnums)}
        if compiler_options:
            kwargs["compiler_options"] = dict(compiler_options)
        if in_shardings is not None:
            kwargs["in_shardings"] = self._to_sharding(in_shardings)
        if out_shardings is not None:
            kwargs["out_shardings"] = self._to_sharding(out_shardings)
        return PartitionedFunction(fn, jax.jit(fn, **kwargs), self.mesh, self)

    def with_sharding_constraint(self, x: Any, spec: LogicalSpec) -> Any:
        """`jax.lax.with_sharding_constraint` by logical names, inside a jitted function."""
        return jax.lax.with_sharding_constraint(x, self.sharding(spec, np.shape(x)))

    # -- activations ---------------------------------------------------------------------
    @contextlib.contextmanager
    def activated(self) -> Iterator[Partitioner]:
        """Makes this the `current_partitioner()` inside the block (functions from `partition`
        do it themselves while they are traced)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def constrain(self, x: Any, spec: LogicalSpec) -> Any:
        """An activation constrained to its logical names (`with_sharding_constraint`), a
        dimension its mesh axes do not divide left unsharded without a warning (a batch of 1
        while decoding); `x` unchanged when `constrain_activations` is off."""
        if not self.constrain_activations:
            return x
        names = tuple(spec)
        mesh_spec = logical_to_mesh_spec(names, self.rules, self.mesh.shape, np.shape(x), "<activation>", "quiet")
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, mesh_spec))

    # -- data ----------------------------------------------------------------------------
    def _batch_mesh_axes(self):
        first = self.mesh_spec(self.batch_spec[:1])
        return first[0] if len(first) else None

    def batch_parts(self) -> int:
        """How many pieces the batch dimension is split into (the product of its mesh axes)."""
        axes = self._batch_mesh_axes()
        axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        return int(np.prod([self.mesh.shape[a] for a in axes], dtype=np.int64))

    def data_layout(self, process_index: int | None = None) -> DataLayout:
        """Which shard of the global batch this host (or `process_index`) reads."""
        return data_layout(self.mesh, self._batch_mesh_axes(), process_index)

    def shard_batch(self, host_local_batch: Any, spec: Sequence[str | None] | None = None) -> Any:
        """Global `jax.Array`s from this host's rows (a pytree of numpy arrays).

        Each host passes the rows of its `data_layout()` shard; hosts of the same replica
        pass the same rows. The global batch is `num_shards` times the host batch.
        """
        spec = tuple(self.batch_spec if spec is None else spec)
        layout = self.data_layout()

        def one(x):
            x = np.asarray(x)
            names = spec[: x.ndim] + (None,) * max(0, x.ndim - len(spec))
            global_shape = (x.shape[0] * layout.num_shards,) + x.shape[1:]
            sharding = self.sharding(names, global_shape, "batch")
            return jax.make_array_from_process_local_data(sharding, x, global_shape)

        return jax.tree.map(one, host_local_batch)
