"""Applying a stack of identical layers: unrolled (`layers_0`, `layers_1`, ...) or scanned
(`layers`, parameters stacked on a leading `layers` axis), optionally rematerialised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.fp8 import FP8_STATE
from cairn.models.layers import remat_policy as _policy


def apply_layers(
    layer_cls,
    num_layers: int,
    scan: bool,
    remat: str,
    layer_kwargs: dict[str, Any],
    x,
    *args,
    sparse: Callable[[int], bool] | None = None,
):
    """Runs `num_layers` layers on the carry `x`; `args` are the same for every layer.

    `sparse` (a mixture-of-experts config's `is_sparse`): layer `i` gets `sparse=sparse(i)`
    (scanned layers are identical: they all get `sparse(0)`). Values the layers sow in the `moe`
    collection are stacked on a leading axis when scanned. Must be called inside a compact
    method (the layers become its submodules).
    """
    per_layer = (lambda i: {}) if sparse is None else (lambda i: {"sparse": sparse(i)})
    if remat != "none":
        layer_cls = nn.remat(layer_cls, policy=_policy(remat), prevent_cse=not scan)
    if scan:
        stack = nn.scan(
            layer_cls,
            variable_axes={"params": 0, "cache": 0, "moe": 0, "lora": 0, FP8_STATE: 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast,) * len(args),
            length=num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        x, _ = stack(scanned=True, name="layers", **layer_kwargs, **per_layer(0))(x, *args)
        return x
    for i in range(num_layers):
        x = layer_cls(name=f"layers_{i}", **layer_kwargs, **per_layer(i))(x, *args)
    return x


def unstack_layers(tree: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Turns a scanned `{'layers': stacked}` subtree into `{'layers_i': ...}` (other keys kept)."""
    out = {k: v for k, v in tree.items() if k != "layers"}
    if "layers" in tree:
        for i in range(num_layers):
            out[f"layers_{i}"] = jax.tree_util.tree_map(lambda a, i=i: a[i], tree["layers"])
    return out


def stack_layers(tree: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The inverse of `unstack_layers`."""
    names = [f"layers_{i}" for i in range(num_layers)]
    missing = [n for n in names if n not in tree]
    if missing:
        raise KeyError(f"stack_layers: missing {missing} in {sorted(tree)}")
    out = {k: v for k, v in tree.items() if k not in names}
    layers: list[Any] = [tree[n] for n in names]
    out["layers"] = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers)
    return out
