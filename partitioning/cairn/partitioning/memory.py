"""Bytes per device of parameters, optimizer state and activations, without allocating."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from cairn.partitioning.opt_state import opt_state_logical_specs, opt_state_mesh_spec
from cairn.partitioning.partitioner import Partitioner
from cairn.partitioning.tree import map_specs

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device (the most loaded device) of each part of the training state."""

    params: int
    opt_state: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return self.params + self.opt_state + self.activations

    def __str__(self) -> str:
        rows = [
            ("params", self.params),
            ("opt_state", self.opt_state),
            ("activations", self.activations),
            ("total", self.total),
        ]
        return "\n".join(f"{name:<12} {value / GiB:10.3f} GiB/device" for name, value in rows)


def _bytes_per_device(tree: Any, specs: Any, partitioner: Partitioner, opt_state: bool = False) -> int:
    mesh_shape = partitioner.mesh.shape
    # An optimizer state resolves as its shardings do: indivisible dimensions replicated quietly.
    resolve = (
        (lambda s, shape, path: opt_state_mesh_spec(partitioner, s, shape, path))
        if opt_state
        else partitioner.mesh_spec
    )
    sizes = []

    def one(path, spec, x):
        shape = tuple(np.shape(x))
        mesh_spec = resolve(spec, shape, path)
        shard = list(shape)
        for i, axes in enumerate(mesh_spec):
            if axes is not None:
                axes = (axes,) if isinstance(axes, str) else axes
                shard[i] = -(-shard[i] // math.prod(mesh_shape[a] for a in axes))
        sizes.append(math.prod(shard) * np.dtype(x.dtype).itemsize)

    map_specs(one, specs, tree)
    return int(sum(sizes))


def estimate_memory(
    params: Any,
    param_specs: Any,
    partitioner: Partitioner,
    opt_state: Any = None,
    opt_state_specs: Any = None,
    activations: tuple[Any, Any] | None = None,
) -> MemoryEstimate:
    """Bytes per device under `partitioner`'s mesh and rules.

    Args:
      params: a tree of arrays or `jax.ShapeDtypeStruct`s (e.g. from `jax.eval_shape`).
      param_specs: a parallel tree of logical specs.
      opt_state: the optimizer state tree (shapes), optional.
      opt_state_specs: its logical specs; default `opt_state_logical_specs(...)`.
      activations: `(shapes, specs)` of the activations kept for the backward pass, e.g.
        from `transformer_activations`.
    """
    estimate = {"params": _bytes_per_device(params, param_specs, partitioner)}
    if opt_state is not None:
        if opt_state_specs is None:
            opt_state_specs = opt_state_logical_specs(params, param_specs, opt_state)
        estimate["opt_state"] = _bytes_per_device(opt_state, opt_state_specs, partitioner, opt_state=True)
    if activations is not None:
        estimate["activations"] = _bytes_per_device(activations[0], activations[1], partitioner)
    return MemoryEstimate(**estimate)


def transformer_activations(
    batch_size: int,
    length: int,
    num_layers: int,
    emb_dim: int,
    mlp_dim: int,
    num_heads: int,
    head_dim: int,
    dtype=np.float32,
    gated_mlp: bool = True,
    cross_length: int | None = None,
    remat: bool = False,
) -> tuple[dict, dict]:
    """A rough count of what backprop keeps per transformer layer stack: residual and norm
    outputs, q/k/v and attention weights, MLP hidden units (two with a gated MLP), plus
    cross-attention when `cross_length` (a decoder). With `remat`, only each layer's input.
    Returns `(shapes, specs)` for `estimate_memory(..., activations=...)`."""
    b, l = batch_size, length

    def sds(*shape):
        return jax.ShapeDtypeStruct((num_layers,) + shape, dtype)

    shapes = {"residual": sds(b, l, emb_dim)}
    specs: dict[str, tuple[str | None, ...]] = {"residual": ("layers", "batch", "length", "embed")}
    if not remat:
        heads = ("layers", "batch", "length", "heads", "kv")
        shapes.update(
            norm=sds(b, l, emb_dim),
            qkv=sds(b, l, num_heads, 3 * head_dim),
            attention=sds(b, num_heads, l, l),
            mlp=sds(b, l, mlp_dim * (2 if gated_mlp else 1)),
        )
        specs.update(
            norm=specs["residual"],
            qkv=heads,
            attention=("layers", "batch", "heads", "length", None),
            mlp=("layers", "batch", "length", "mlp"),
        )
        if cross_length:
            shapes.update(
                cross_q=sds(b, l, num_heads, head_dim),
                cross_kv=sds(b, cross_length, num_heads, 2 * head_dim),
                cross_attention=sds(b, num_heads, l, cross_length),
            )
            specs.update(cross_q=heads, cross_kv=heads, cross_attention=specs["attention"])
    return shapes, specs
