"""Mesh checks of a config: the mesh resolved against the devices (a mesh that fits suggested
when it does not) and the expert axis against the number of experts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from cairn.launchers.config_error import ConfigError


def mesh_shapes(device_count: int) -> list[dict[str, int]]:
    """Every (data, fsdp, model) shape whose product is `device_count`."""
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    shapes = [
        {"data": d, "fsdp": f, "model": device_count // (d * f)}
        for d, f in itertools.product(divisors, divisors)
        if device_count % (d * f) == 0
    ]
    return sorted(shapes, key=lambda s: (-s["data"], -s["fsdp"]))


def suggest_mesh(mesh: Mapping[str, int], device_count: int) -> dict[str, int]:
    """A mesh for `device_count` devices close to `mesh`: its model, expert and fsdp sizes cut to
    what divides the devices, data parallelism for the rest (the expert axis named only when
    it is larger than 1)."""

    model = math.gcd(max(1, int(mesh.get("model", 1))), device_count)
    expert = math.gcd(max(1, int(mesh.get("expert", 1))), device_count // model)
    fsdp = math.gcd(max(1, int(mesh.get("fsdp", 1))), device_count // (model * expert))
    data = device_count // (model * expert * fsdp)
    return (
        {"data": data, "fsdp": fsdp, "expert": expert, "model": model}
        if expert > 1
        else {"data": data, "fsdp": fsdp, "model": model}
    )


def resolve_mesh(mesh: Mapping[str, int], device_count: int, process_count: int = 1) -> dict[str, int]:
    """The mesh with its -1 axis filled in by `cairn.partitioning`'s own resolution (the one
    `create_mesh` uses); `ConfigError` naming the mesh, the process and device counts and a mesh
    that fits when it does not fit the devices. An expert axis of size 1 is left out (the
    partitioning rules count a missing expert axis as size 1): a dense run's mesh is
    `{data, fsdp, model}` as before the axis existed."""
    from cairn.partitioning.mesh import DEFAULT_AXES, EXPERT, MeshShapeError, resolve_axes

    axes = {a: int(mesh.get(a, 1)) for a in DEFAULT_AXES}
    if axes[EXPERT] == 1:
        del axes[EXPERT]
    try:
        resolved = resolve_axes(axes, device_count)
        if resolved.get(EXPERT) == 1:  # -1 that left one device
            del resolved[EXPERT]
        return resolved
    except MeshShapeError as e:
        per = device_count // max(1, process_count)
        fits = suggest_mesh({a: s for a, s in axes.items() if s != -1}, device_count)
        raise ConfigError(
            "partitioning.mesh", f"{e} ({process_count} process(es) x {per} device(s)); a mesh that fits: {fits}"
        ) from None


def check_expert_axis(mesh: Mapping[str, int], net: Any) -> None:
    """`ConfigError` naming `model.moe.num_experts` when the mesh's expert axis (resolved, or a
    fixed size) does not divide the experts of `net` (the model config, or a function returning it,
    called only when the expert axis is larger than 1). A dense
    model may use the axis (more data parallelism)."""
    size = int(mesh.get("expert", 1))
    if size <= 1:
        return
    moe = getattr(net() if callable(net) else net, "moe", None)
    experts = moe.num_experts if moe is not None else 0
    if experts and experts % size:
        raise ConfigError(
            "model.moe.num_experts",
            f"{experts} experts do not divide over partitioning.mesh.expert={size}: use a multiple of {size} "
            f"experts, or an expert axis that divides {experts}",
        )
