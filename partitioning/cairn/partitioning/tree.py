"""Pytree helpers: logical specs as leaves, readable paths."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec


def is_spec(x: Any) -> bool:
    """A logical spec leaf: a PartitionSpec, or a tuple of names and Nones."""
    if isinstance(x, PartitionSpec):
        return True
    # Plain tuples only: namedtuples (optimizer states, even empty ones) are tree nodes.
    return type(x) is tuple and all(e is None or isinstance(e, str) for e in x)


def path_str(path) -> str:
    """'encoder/layers_0/kernel' for a jax key path."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def map_specs(fn, specs: Any, *rest: Any) -> Any:
    """`fn(path_str, spec, *rest_leaves)` over a tree of logical specs and parallel trees."""
    return jax.tree_util.tree_map_with_path(lambda p, s, *r: fn(path_str(p), s, *r), specs, *rest, is_leaf=is_spec)
