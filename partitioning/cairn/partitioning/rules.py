"""Logical axis rules: how named array dimensions ('batch', 'embed', ...) map to mesh axes."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from jax.sharding import PartitionSpec

#: A mesh axis, a tuple of mesh axes (the dimension is split over their product), or None.
MeshAxes = None | str | tuple[str, ...]
#: Ordered (logical name, mesh axes) pairs. Earlier rules win; a logical name may appear
#: several times, and the first rule whose mesh axes are still free in the array is used.
LogicalAxisRules = Sequence[tuple[str, MeshAxes]]
#: A logical spec: one logical name (or None) per array dimension.
LogicalSpec = PartitionSpec | tuple[str | None, ...]

ON_INDIVISIBLE = ("replicate", "error", "quiet")


class UnknownLogicalAxisError(ValueError):
    """An array dimension names a logical axis that no rule mentions."""


class IndivisibleDimensionError(ValueError):
    """An array dimension is not divisible by the size of the mesh axes a rule maps it to."""


class IndivisibleDimensionWarning(UserWarning):
    """A dimension was left unsharded because its size does not divide by its mesh axes."""


#: Mesh axes a mesh may lack although the standard rules name them: a missing one counts as
#: an axis of size 1 (rules drop it), so meshes built before the axis existed keep working.
#: Any other mesh axis a rule names must be in the mesh.
OPTIONAL_AXES = ("expert",)


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    fsdp: bool = False,
    additional_rules: LogicalAxisRules = (),
) -> list:
    """t5x's standard rules, plus an FSDP mode over the 'fsdp' mesh axis and expert
    parallelism over the 'expert' mesh axis.

    - expert -> expert (a mixture of experts' expert dimension: kernels `[expert, embed, mlp]`
      and the dispatched activations `[expert, batch, capacity, embed]`).
    - batch -> data x expert (and fsdp too when `fsdp`) where the array has no expert
      dimension (GShard: every token-level activation is spread over the expert axis as well,
      and the dispatch einsum moves tokens to their experts' devices); data (x fsdp) where the
      expert dimension took the expert axis.
    - vocab / mlp / heads / joined_kv -> model; kv -> model as well, which takes effect only
      where 'heads' did not take 'model'.
    - embed: unsharded (1, 1); -> model for activations (2, *); -> data for parameters
      (*, 2, t5x's 2-D parameter sharding); -> fsdp when `fsdp` (ZeRO-3 style: parameters
      sharded over 'fsdp', gathered per layer by GSPMD).
    - length, layers, stack, relpos_buckets, abspos_buckets, mlp_activations: unsharded.

    The 'expert' axis is optional (`OPTIONAL_AXES`): on a mesh without it these rules are
    exactly the rules without expert parallelism.
    """
    if activation_partitioning_dims not in (1, 2) or parameter_partitioning_dims not in (1, 2):
        raise ValueError(
            "activation_partitioning_dims and parameter_partitioning_dims must be 1 or 2, "
            f"got {activation_partitioning_dims} and {parameter_partitioning_dims}"
        )
    batch: tuple[str, ...] = ("data", "fsdp") if fsdp else ("data",)
    rules: list = [
        ("expert", "expert"),  # first: an expert dimension takes the axis before the batch does
        ("batch", (*batch, "expert")),
        ("batch", batch[0] if len(batch) == 1 else batch),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("joined_kv", "model"),
        ("kv", "model"),
    ]
    if activation_partitioning_dims == 2:
        rules.append(("embed", "model"))
    if fsdp:
        rules.append(("embed", "fsdp"))
    if parameter_partitioning_dims == 2:
        rules.append(("embed", "data"))
    if activation_partitioning_dims == 1 and parameter_partitioning_dims == 1 and not fsdp:
        rules.append(("embed", None))
    rules += [
        (name, None) for name in ("length", "layers", "stack", "relpos_buckets", "abspos_buckets", "mlp_activations")
    ]
    return rules + list(additional_rules)


def rules_for_mesh(rules: LogicalAxisRules, mesh_shape: Mapping[str, int]) -> list:
    """`rules` with the `OPTIONAL_AXES` the mesh lacks taken out of each rule's mesh axes (a
    rule left with none maps its name to None); for Flax's `nn.logical_axis_rules`, which
    would otherwise name an axis the mesh does not have. Other missing axes are kept (and
    fail where used)."""
    out = []
    for name, mesh_axes in rules:
        axes = tuple(a for a in _as_tuple(mesh_axes) if a in mesh_shape or a not in OPTIONAL_AXES)
        out.append((name, None if not axes else (axes[0] if len(axes) == 1 else axes)))
    return out


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh_spec(
    spec: LogicalSpec,
    rules: LogicalAxisRules,
    mesh_shape: Mapping[str, int],
    shape: Sequence[int] | None = None,
    path: str = "<array>",
    on_indivisible: str = "replicate",
) -> PartitionSpec:
    """Resolves one logical spec to a mesh `PartitionSpec`.

    Rules are taken in order (as Flax does): a rule assigns its mesh axes to the dimensions
    with its logical name unless one of those mesh axes is already used in this array.
    When `shape` is given, a rule whose mesh axes do not divide the dimension is skipped;
    if no later rule fits, the dimension is replicated with an `IndivisibleDimensionWarning`
    naming `path` (with `on_indivisible='error'`, an `IndivisibleDimensionError`; with
    'quiet', no warning: activations, whose batch may be any size). A logical name that no
    rule mentions raises `UnknownLogicalAxisError` naming `path`. A rule's mesh axes that are
    `OPTIONAL_AXES` the mesh lacks are dropped; any other mesh axis it lacks is a `ValueError`.
    """
    if on_indivisible not in ON_INDIVISIBLE:
        raise ValueError(f"on_indivisible must be one of {ON_INDIVISIBLE}, got {on_indivisible!r}")
    names = tuple(spec)
    for name in names:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{path}: logical spec entries must be names or None, got {name!r} in {names}")
    if shape is not None:
        if len(names) > len(shape):
            raise ValueError(
                f"parameter {path!r}: logical spec {names} has {len(names)} entries "
                f"but the array has shape {tuple(shape)}"
            )
        names += (None,) * (len(shape) - len(names))  # like PartitionSpec: missing = unsharded
    known = {rule_name for rule_name, _ in rules}
    for name in names:
        if name is not None and name not in known:
            raise UnknownLogicalAxisError(
                f"parameter {path!r}: logical axis {name!r} is not named by any rule (rules name {sorted(known)})"
            )
    unassigned = object()
    result: list = [unassigned if name is not None else None for name in names]
    used: set = set()
    skipped: dict = {}
    for rule_name, mesh_axes in rules:
        axes = tuple(a for a in _as_tuple(mesh_axes) if a in mesh_shape or a not in OPTIONAL_AXES)
        missing = [a for a in axes if a not in mesh_shape]
        for i, name in enumerate(names):
            if name != rule_name or result[i] is not unassigned:
                continue
            if missing:
                raise ValueError(
                    f"rule ({rule_name!r}, {mesh_axes!r}) names mesh axes {missing} "
                    f"that the mesh {dict(mesh_shape)} does not have"
                )
            if used.intersection(axes):
                continue
            size = math.prod(mesh_shape[a] for a in axes)
            if shape is not None and shape[i] % size:
                message = (
                    f"parameter {path!r}: dimension {i} ({name!r}, size {shape[i]}) is not "
                    f"divisible by mesh axes {axes} of size {size}"
                )
                if on_indivisible == "error":
                    raise IndivisibleDimensionError(message)
                skipped[i] = message
                continue
            result[i] = None if not axes else (axes[0] if len(axes) == 1 else axes)
            used.update(axes)
    for i, value in enumerate(result):
        if value is unassigned:
            result[i] = None
            if i in skipped and on_indivisible != "quiet":
                warnings.warn(skipped[i] + "; replicating it", IndivisibleDimensionWarning, stacklevel=3)
    return PartitionSpec(*result)
