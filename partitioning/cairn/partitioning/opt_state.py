"""Logical specs for optimizer states, whose leaves may differ in shape from their params."""

from __future__ import annotations

from typing import Any, Tuple

import jax
from jax.sharding import PartitionSpec

from cairn.partitioning.tree import is_spec


def _reduced_spec(param_shape: Tuple[int, ...], spec: Tuple, leaf_shape: Tuple[int, ...]) -> Tuple:
    """The spec of a statistic shaped like the param with one dimension removed (Adafactor's
    factored rows and columns), or () (replicated) when that is absent or ambiguous."""
    if len(leaf_shape) != len(param_shape) - 1:
        return ()
    candidates = {tuple(spec[:i] + spec[i + 1:]) for i in range(len(param_shape))
                  if param_shape[:i] + param_shape[i + 1:] == leaf_shape}
    return candidates.pop() if len(candidates) == 1 else ()


def opt_state_logical_specs(params: Any, param_specs: Any, opt_state: Any) -> Any:
    """Logical specs for an optimizer state, without knowing the optimizer library.

    Each subtree of `opt_state` with the same structure as `params` (Adam's `mu`/`nu`,
    Adafactor's `v_row`/`v_col`/`v`, ...) gets, leaf by leaf: the param's spec when the
    shapes are equal; the spec with one entry removed when the leaf is the param's shape with
    one dimension removed and that removal is unambiguous; otherwise replication. Every
    other leaf (step counts, scalars) is replicated. Returns a tree shaped like `opt_state`
    whose leaves are `PartitionSpec`s of logical names.
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
            return jax.tree.structure(node) == param_def
        except Exception:  # noqa: BLE001 - an unflattenable node simply does not match
            return False

    def specs_for(node):
        if not matches(node):
            return jax.tree.map(lambda _: PartitionSpec(), node)
        leaves = jax.tree.leaves(node)
        out = []
        for leaf, param, spec in zip(leaves, param_leaves, spec_leaves):
            pshape, lshape, spec = tuple(param.shape), tuple(getattr(leaf, "shape", ())), tuple(spec)
            out.append(PartitionSpec(*(spec if lshape == pshape else _reduced_spec(pshape, spec, lshape))))
        return jax.tree.unflatten(param_def, out)

    return jax.tree.map(specs_for, opt_state, is_leaf=matches)
