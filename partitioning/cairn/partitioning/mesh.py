"""Device meshes: one slice (ICI only) or several slices (ICI within, DCN across)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

#: The mesh axes the standard rules use, in mesh order: the axes the batch is split over
#: (data, fsdp, expert) lead, so that each host's rows are one contiguous block.
DATA, FSDP, EXPERT, MODEL = "data", "fsdp", "expert", "model"
DEFAULT_AXES: Mapping[str, int] = {DATA: -1, FSDP: 1, EXPERT: 1, MODEL: 1}


class MeshShapeError(ValueError):
    """The requested mesh shape does not fit the devices."""


def resolve_axes(axes: Mapping[str, int], num_devices: int) -> dict:
    """Returns `axes` with its one `-1` entry replaced by the size that uses every device."""
    axes = dict(axes)
    if not axes:
        raise MeshShapeError("a mesh needs at least one axis")
    wild = [name for name, size in axes.items() if size == -1]
    if len(wild) > 1:
        raise MeshShapeError(f"only one mesh axis may be -1, got {wild} in {axes}")
    bad = {name: size for name, size in axes.items() if size != -1 and (not isinstance(size, int) or size < 1)}
    if bad:
        raise MeshShapeError(f"mesh axis sizes must be positive integers or -1, got {bad}")
    known = math.prod(size for size in axes.values() if size != -1)
    if wild:
        if num_devices % known:
            raise MeshShapeError(
                f"mesh axes {axes}: the fixed axes need a multiple of {known} devices, "
                f"but there are {num_devices} devices"
            )
        axes[wild[0]] = num_devices // known
    elif known != num_devices:
        raise MeshShapeError(f"mesh shape {axes} has {known} devices but {num_devices} devices were given")
    return axes


def _slices(devices: Sequence, num_slices: int) -> list:
    """Groups devices into `num_slices` slices: by `slice_index` (TPU) when it has that many
    values, else by process when there are that many processes, else in contiguous runs of
    the (process, id) order (how slices are simulated on CPU)."""
    if len(devices) % num_slices:
        raise MeshShapeError(f"{len(devices)} devices cannot form {num_slices} equal slices")
    for key in ("slice_index", "process_index"):
        values = sorted({getattr(d, key, None) for d in devices}, key=lambda v: (v is None, v))
        if len(values) == num_slices and None not in values:
            groups = [[d for d in devices if getattr(d, key) == v] for v in values]
            if len({len(g) for g in groups}) == 1:
                return [sorted(g, key=lambda d: d.id) for g in groups]
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    per = len(ordered) // num_slices
    return [ordered[i * per : (i + 1) * per] for i in range(num_slices)]


def _slice_array(shape: Sequence[int], devices: Sequence) -> np.ndarray:
    """Devices of one slice laid out in `shape`: topology-aware on TPU (JAX's physical layout)
    where that keeps each host's devices one contiguous block in mesh order (the batch rows a
    host feeds must be one block: `data_layout`), else in host order."""
    if devices and devices[0].platform == "tpu":
        try:
            physical = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            physical = None
        if physical is not None and _hosts_contiguous(physical):
            return physical
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return np.asarray(ordered, dtype=object).reshape(shape)


def _hosts_contiguous(array: np.ndarray) -> bool:
    """Whether each process's devices are one run of the array in row-major order (a multi-host
    TPU slice's physical ring order can interleave hosts: v5e 4x4 puts host 0's chips at
    positions 0, 1, 6 and 15 of a 16-device data axis)."""
    hosts = [d.process_index for d in array.flat]
    runs = [h for i, h in enumerate(hosts) if i == 0 or h != hosts[i - 1]]
    return len(runs) == len(set(runs))


def create_mesh(
    axes: Mapping[str, int] | None = None,
    devices: Sequence | None = None,
    num_slices: int = 1,
    dcn_axes: Mapping[str, int] | None = None,
) -> Mesh:
    """Builds a `jax.sharding.Mesh` with GSPMD-style (`AxisType.Auto`) axes.

    Args:
      axes: global mesh axis sizes in mesh order, e.g. `{'data': -1, 'fsdp': 1, 'expert': 1,
        'model': 2}` (default `DEFAULT_AXES`); one size may be -1 for "the rest of the devices".
        An axis left out is not in the mesh (the standard rules treat a missing `expert` axis
        as one of size 1).
      devices: the devices to use (default: `jax.devices()`).
      num_slices: how many slices (TPU slices, or groups of hosts) the devices form. With
        more than one, the mesh is hybrid: `dcn_axes` are split across slices (DCN) and the
        rest within each slice (ICI).
      dcn_axes: how many slices each axis spans; default `{first axis: num_slices}` (data
        parallelism across slices, as t5x and MaxText do). Each global size must be a
        multiple of its DCN size.
    """
    axes = dict(DEFAULT_AXES if axes is None else axes)
    devices = list(jax.devices() if devices is None else devices)
    axes = resolve_axes(axes, len(devices))
    names = tuple(axes)
    if num_slices < 1:
        raise MeshShapeError(f"num_slices must be >= 1, got {num_slices}")
    if dcn_axes is None:
        dcn_axes = {names[0]: num_slices}
    unknown = sorted(set(dcn_axes) - set(names))
    if unknown:
        raise MeshShapeError(f"dcn_axes names {unknown}, which are not mesh axes {list(names)}")
    dcn = [dcn_axes.get(n, 1) for n in names]
    if math.prod(dcn) != num_slices:
        raise MeshShapeError(f"dcn_axes {dict(dcn_axes)} span {math.prod(dcn)} slices, but num_slices is {num_slices}")
    for name, d in zip(names, dcn):
        if axes[name] % d:
            raise MeshShapeError(f"mesh axis {name!r} of size {axes[name]} cannot span {d} slices")
    ici = [axes[n] // d for n, d in zip(names, dcn)]
    if num_slices == 1:
        array = _slice_array(ici, devices)
    else:
        blocks = np.empty(dcn + ici, dtype=object)
        for index, group in zip(np.ndindex(*dcn), _slices(devices, num_slices)):
            blocks[index] = _slice_array(ici, group)
        # (d0, ..., i0, ...) -> (d0, i0, d1, i1, ...) -> global: each slice is a contiguous block.
        rank = len(names)
        order = [k for pair in zip(range(rank), range(rank, 2 * rank)) for k in pair]
        array = blocks.transpose(order).reshape([axes[n] for n in names])
    return Mesh(array, names, axis_types=(AxisType.Auto,) * len(names))
