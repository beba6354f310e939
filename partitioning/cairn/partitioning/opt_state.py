"""Optimizer-state shardings: the one path the train step and checkpoint restore share.

An optimizer state holds, besides counts, subtrees shaped like the params (Adam's `mu` and
`nu`, Adafactor's `v`, `v_row`, `v_col`). A leaf shaped like its param is sharded like it; a
leaf shaped like its param with one dimension removed (Adafactor's factored second moments)
keeps the logical names of the dimensions it keeps, and is sharded along them where they
divide; anything else is replicated. A subtree of a masked transformation (`optax.masked`,
`multi_transform`: an empty `MaskedNode` at each param it does not handle) counts as shaped like
the params.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cairn.partitioning.rules import logical_to_mesh_spec
from cairn.partitioning.tree import is_spec, map_specs


def _reduced_spec(param_shape: tuple[int, ...], spec: tuple, leaf_shape: tuple[int, ...]) -> tuple:
    """The spec of a statistic shaped like the param with one dimension removed (Adafactor's
    factored rows and columns), or () (replicated) when that is absent or ambiguous."""
    if len(leaf_shape) != len(param_shape) - 1:
        return ()
    spec = tuple(spec) + (None,) * (len(param_shape) - len(spec))
    candidates = {
        tuple(spec[:i] + spec[i + 1 :])
        for i in range(len(param_shape))
        if param_shape[:i] + param_shape[i + 1 :] == leaf_shape
    }
    return candidates.pop() if len(candidates) == 1 else ()


def _is_placeholder(x: Any) -> bool:
    """An empty namedtuple where a param's state would be: optax's `MaskedNode`, which
    `optax.masked` and `multi_transform` put at the params a transformation does not handle."""
    return isinstance(x, tuple) and type(x) is not tuple and len(x) == 0


def opt_state_logical_specs(params: Any, param_specs: Any, opt_state: Any) -> Any:
    """Logical specs for an optimizer state, without knowing the optimizer library.

    Each subtree of `opt_state` with the same structure as `params` gets, leaf by leaf: the
    param's spec when the shapes are equal; the spec with one entry removed when the leaf is
    the param's shape with one dimension removed and that removal is unambiguous (optax's
    Adafactor: `v_row` drops the largest of the two largest dimensions, `v_col` the other; a
    square `[n, n]` kernel is ambiguous); otherwise replication. Every other leaf (step
    counts, scalars) is replicated. Returns a tree shaped like `opt_state` whose leaves are
    `PartitionSpec`s of logical names.
    """
    param_def = jax.tree.structure(params)
    param_leaves = jax.tree.leaves(params)
    spec_leaves = jax.tree.leaves(param_specs, is_leaf=is_spec)
    if len(spec_leaves) != len(param_leaves):
        raise ValueError(f"param_specs has {len(spec_leaves)} specs for {len(param_leaves)} params")

    def matches(node) -> bool:
        if node is None:
            return False
        try:
            structure = jax.tree.structure(node, is_leaf=_is_placeholder)
            return bool(structure == param_def)  # type: ignore[operator]  # PyTreeDef's stub lacks __eq__
        except Exception:
            return False

    def specs_for(node):
        if not matches(node):
            return jax.tree.map(lambda _: PartitionSpec(), node)
        leaves = jax.tree.leaves(node, is_leaf=_is_placeholder)
        out = []
        for leaf, param, spec in zip(leaves, param_leaves, spec_leaves):
            if _is_placeholder(leaf):  # a param another transformation handles: no state here
                out.append(leaf)
                continue
            pshape, lshape, spec = tuple(param.shape), tuple(getattr(leaf, "shape", ())), tuple(spec)
            out.append(PartitionSpec(*(spec if lshape == pshape else _reduced_spec(pshape, spec, lshape))))
        return jax.tree.unflatten(param_def, out)

    return jax.tree.map(specs_for, opt_state, is_leaf=matches)


def opt_state_mesh_spec(
    partitioner: Any, spec: Any, shape: tuple[int, ...], path: str = "<opt_state>"
) -> PartitionSpec:
    """The mesh spec of one optimizer-state leaf: `partitioner`'s rules, an indivisible
    dimension replicated without a warning and whatever `on_indivisible` says (each dimension
    here is one of its param's, which was already checked and warned about by name)."""
    return logical_to_mesh_spec(spec, partitioner.rules, partitioner.mesh.shape, shape, path, "quiet")


def opt_state_shardings(partitioner: Any, params: Any, param_specs: Any, opt_state: Any) -> Any:
    """`NamedSharding`s for `opt_state` (arrays or `jax.ShapeDtypeStruct`s) on `partitioner`'s
    mesh, from `opt_state_logical_specs`; see `opt_state_mesh_spec` for indivisible sizes."""
    specs = opt_state_logical_specs(params, param_specs, opt_state)
    mesh = partitioner.mesh
    return map_specs(
        lambda path, s, x: NamedSharding(mesh, opt_state_mesh_spec(partitioner, s, np.shape(x), path)), specs, opt_state
    )
