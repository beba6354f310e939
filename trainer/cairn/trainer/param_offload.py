"""Parameters in host memory (`TrainerConfig.offload_params`): the float32 master weights of
mixed-precision training live beside the offloaded optimizer state, and the device keeps only
their copy in the precision the model computes in.

A model stored in float32 and computed in bfloat16 casts most parameters (its kernels) to
bfloat16 before using them, and never uses their float32 values. `cast_only_dtypes` finds those
parameters in the loss function's jaxpr: a parameter whose every use (followed into scans, remat,
jit and custom-derivative calls) is one cast to a narrower dtype. Those are offloaded: their
float32 masters live in host memory, and the train state keeps their cast copy on the device
(`TrainState.compute`), which the update remakes from each group's new float32 values while
they are on the device. A step computes with the copy; the gradient with respect to the cast
copy, cast back to float32, is the gradient with respect to the float32 parameter bit for bit
(the transpose of a cast is the cast back), so a step on the copy trains as a step on the
float32 parameters does. A parameter used in any other way (a norm's scale read in float32, an
embedding gathered before its cast, one cast twice) stays on the device as it is.

Each float32 master crosses the host link once each way per step, in the update. (Moving the
masters in at the top of the step to cast them was tried first: XLA turns a parameter's two
moves into one transfer whose float32 buffer then stays on the device through every
microbatch; benchmarks/RESULTS.md, 2026-12-07 evening.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from cairn.trainer.offload_update import parameter_groups

HOST_MEMORY_KIND = "pinned_host"  # where offloaded state lives
DEVICE_MEMORY_KIND = "device"

# Primitives that pass an array through unchanged in value (a use of their output is a use of
# their input).
_TRANSPARENT = frozenset({"sharding_constraint", "copy", "copy_p", "optimization_barrier"})


def _sub_jaxpr(eqn: Any) -> Any | None:
    """The jaxpr an equation calls with its operands one for one (scan, remat, jit, custom
    derivatives, shard_map), or None."""
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(name)
        if sub is None:
            continue
        inner = sub.jaxpr if hasattr(sub, "jaxpr") else sub
        if isinstance(inner, jcore.Jaxpr) and len(inner.invars) == len(eqn.invars):
            return inner
    return None


def _cast_uses(jaxpr: Any, var: Any, uses: list[Any]) -> bool:
    """Appends to `uses` the dtype of every cast `var` reaches in `jaxpr` (through transparent
    and call-like equations); False if `var` has any other use (an output of the jaxpr, an
    equation of another kind)."""
    if any(v is var for v in jaxpr.outvars):
        return False
    for eqn in jaxpr.eqns:
        positions = [i for i, v in enumerate(eqn.invars) if v is var]
        if not positions:
            continue
        name = eqn.primitive.name
        if name == "convert_element_type" and not eqn.params.get("weak_type", False):
            uses.append(np.dtype(eqn.params["new_dtype"]))
            continue
        if name in _TRANSPARENT and len(eqn.invars) == len(eqn.outvars):
            if not all(_cast_uses(jaxpr, eqn.outvars[i], uses) for i in positions):
                return False
            continue
        sub = _sub_jaxpr(eqn)
        if sub is None:
            return False
        if not all(_cast_uses(sub, sub.invars[i], uses) for i in positions):
            return False
    return True


def cast_only_dtypes(fn: Callable[..., Any], params: Any, *args: Any) -> Any:
    """For each leaf of `params` (arrays or `jax.ShapeDtypeStruct`s), the dtype `fn(params,
    *args)` casts it to when that cast is its only use and narrows it (float32 -> bfloat16);
    else None. `fn` is traced, not run."""
    closed = jax.make_jaxpr(fn)(params, *args)
    treedef: Any
    leaves, treedef = jax.tree.flatten(params)
    invars = closed.jaxpr.invars[: len(leaves)]
    if len(invars) != len(leaves):
        raise ValueError(f"cast_only_dtypes: {len(leaves)} parameters but the jaxpr takes {len(invars)} inputs")
    out: list[Any] = []
    for leaf, var in zip(leaves, invars):
        uses: list[Any] = []
        ok = _cast_uses(closed.jaxpr, var, uses) and len(uses) == 1
        dtype = np.dtype(leaf.dtype)
        floats = ok and all(jnp.issubdtype(d, jnp.floating) for d in (uses[0], dtype))
        narrower = floats and uses[0].itemsize < dtype.itemsize
        out.append(uses[0] if narrower else None)
    return treedef.unflatten(out)


@dataclasses.dataclass(frozen=True)
class ParamOffload:
    """Which parameters live in host memory and how a step reaches them: the params' `device`
    and `host` shardings, the dtype each offloaded one computes in (`cast_only_dtypes`; None: not
    offloaded), and the bytes of float32 parameters moved at once."""

    device: Any
    host: Any
    dtypes: Any
    group_bytes: int

    def _treedef(self) -> Any:
        return jax.tree.structure(self.device)

    def _leaves(self, tree: Any) -> list[Any]:
        return self._treedef().flatten_up_to(tree)

    def param_shardings(self) -> Any:
        """Where each parameter lives between steps: host memory if offloaded, else the device."""
        treedef = self._treedef()
        pairs = zip(self._leaves(self.device), self._leaves(self.host), self._leaves(self.dtypes))
        return treedef.unflatten([h if d is not None else dev for dev, h, d in pairs])

    def compute_shardings(self) -> Any:
        """`TrainState.compute`'s shardings: the device's for each offloaded parameter, None else."""
        treedef = self._treedef()
        return treedef.unflatten(
            [s if d is not None else None for s, d in zip(self._leaves(self.device), self._leaves(self.dtypes))]
        )

    def compute_shapes(self, params: Any) -> Any:
        """`TrainState.compute`'s `ShapeDtypeStruct`s for `params` (shapes)."""
        treedef = self._treedef()
        out = [
            None if d is None else jax.ShapeDtypeStruct(np.shape(p), d)
            for p, d in zip(self._leaves(params), self._leaves(self.dtypes))
        ]
        return treedef.unflatten(out)

    def copy_of(self, params: Any) -> Any:
        """`TrainState.compute` of `params` that are on the device: each offloaded one cast."""
        treedef = self._treedef()
        pairs = zip(self._leaves(params), self._leaves(self.dtypes))
        return treedef.unflatten([None if d is None else p.astype(d) for p, d in pairs])

    def working(self, params: Any, compute: Any) -> Any:
        """The parameters a step computes with: the copy of each offloaded one, the others as
        they are (on the device)."""
        treedef = self._treedef()
        pairs = zip(self._leaves(params), self._leaves(compute), self._leaves(self.dtypes))
        return treedef.unflatten([c if d is not None else p for p, c, d in pairs])


def memory_shardings(shardings: Any) -> tuple[Any, Any]:
    """`(device, host)`: the same shardings in device and in pinned host memory."""
    host = jax.tree.map(lambda s: s.with_memory_kind(HOST_MEMORY_KIND), shardings)
    device = jax.tree.map(lambda s: s.with_memory_kind(DEVICE_MEMORY_KIND), shardings)
    return device, host


def _nbytes(x: Any) -> int:
    return int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize


def device_copy(params: Any, dtypes: Any, device_shardings: Any, group_bytes: int) -> Any:
    """`TrainState.compute` made from `params` (offloaded ones in host memory): each leaf whose
    entry of `dtypes` is a dtype on the device cast to it, the others None; moved a group of
    about `group_bytes` at a time so that the float32 values of one group at most are on the
    device at once (at initialisation and after a restore)."""
    treedef: Any
    leaves, treedef = jax.tree.flatten(params)
    casts = treedef.flatten_up_to(dtypes)
    targets = treedef.flatten_up_to(device_shardings)
    out: list[Any] = [None] * len(leaves)
    previous: list[Any] = []
    for group in parameter_groups([_nbytes(x) for x in leaves], group_bytes):
        moving = [leaves[i] for i in group]
        if previous:  # this group moves in once the previous one is cast
            moving, _ = jax.lax.optimization_barrier((moving, previous))
        for i, x in zip(group, moving):
            out[i] = None if casts[i] is None else jax.device_put(x, targets[i]).astype(casts[i])
        previous = [out[i] for i in group if out[i] is not None]
    return treedef.unflatten(out)


def params_on_device(params: Any) -> Any:
    """`params` with every leaf in host memory moved to device memory (the same sharding
    otherwise); leaves already on the device are returned as they are. For evaluation,
    checksums and exports of a state whose params are offloaded."""

    def one(x: Any) -> Any:
        sharding = getattr(x, "sharding", None)
        if sharding is None or getattr(sharding, "memory_kind", None) != HOST_MEMORY_KIND:
            return x
        return jax.device_put(x, sharding.with_memory_kind(DEVICE_MEMORY_KIND))

    return jax.tree.map(one, params)


def upcast_like(grads: Any, params: Any) -> Any:
    """Gradients of the device copy in the parameters' own dtypes."""
    return jax.tree.map(lambda g, p: g if g.dtype == p.dtype else g.astype(p.dtype), grads, params)


__all__ = [
    "DEVICE_MEMORY_KIND",
    "HOST_MEMORY_KIND",
    "ParamOffload",
    "cast_only_dtypes",
    "device_copy",
    "memory_shardings",
    "params_on_device",
    "upcast_like",
]
