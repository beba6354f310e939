"""Devices of a TPU slice this host does not have, for compiling programs for it ahead of time.

    devices = topology_devices("v5e:2x4")        # 8 chips of TPU v5 lite, from any host
    mesh = create_mesh({"data": -1}, devices=devices)
    with platform.compile_target("tpu"):
        compiled = jax.jit(step).lower(*abstract_args).compile()  # XLA:TPU's own compile
    compiled.memory_analysis()                  # the peak the slice would need, per chip

The TPU compiler ships in the `libtpu` wheel (0.0.42.1, the version `jax[tpu]` 0.10.2 pins); it
compiles for a described slice without a TPU or a network. Install it beside the environment's
packages, not among them (`pip install --no-deps --target <venv>/tpu-compiler libtpu==0.0.42.1`,
what ./bazelw does): an importable libtpu makes JAX try to open a TPU in every process. Nothing
can run on these devices. A name is `GENERATION:TOPOLOGY`: `v5e:1x1`, `v5e:2x4`, `v6e:4x4`,
`v4:2x2x1`, `v5p:2x2x2` (chips along each axis), or a Cloud accelerator type, which names its
default slice (`v5litepod-16` is `v5e:4x4`, `v4-32` is `v4:2x2x4`). Slices larger than one host's
chips describe every host's chips; the compile is the same single program each host would run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

#: Generations: the topology's axes, the chips one host holds (its bounds when the slice is
#: larger), and libtpu's chip configuration (v4 and v5p run two cores as one "megacore").
_GENERATIONS = {
    "v4": (3, (2, 2, 1), "megacore"),
    "v5p": (3, (2, 2, 1), "megacore"),
    "v5e": (2, (2, 2, 1), "default"),
    "v6e": (2, (2, 2, 1), "default"),
}
#: One host of these generations holds up to 8 chips when the slice is that small (v5litepod-8).
_SINGLE_HOST_CHIPS = {"v4": 4, "v5p": 4, "v5e": 8, "v6e": 8}

#: Where ./bazelw installs libtpu, under `sys.prefix` (the virtual environment).
COMPILER_DIR = "tpu-compiler"
GIB = 2**30
#: Device memory a program may use, per chip, by `device_kind`: the v5e's `bytes_limit` as
#: measured on the chip; the others' datasheet HBM less the same reserve (1.6 %).
HBM_BYTES = {
    "TPU v5 lite": int(15.75 * GIB),
    "TPU v6 lite": int(32 * GIB * 15.75 / 16),
    "TPU v4": int(32 * GIB * 15.75 / 16),
    "TPU v5": int(95 * GIB * 15.75 / 16),
}


class TopologyError(ValueError):
    """A topology name that does not parse, or a host that cannot describe it (no libtpu)."""


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """A parsed topology name: the generation and the chips along each axis."""

    generation: str
    shape: tuple[int, ...]

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"

    def host_bounds(self) -> tuple[int, int, int]:
        """The chips one host holds along each axis: the whole slice when it is one host's."""
        shape3 = (*self.shape, 1)[:3]
        if self.chips <= _SINGLE_HOST_CHIPS[self.generation]:
            return (shape3[0], shape3[1], shape3[2])
        return _GENERATIONS[self.generation][1]


#: Cloud TPU accelerator types (`gcloud ... --accelerator-type`): the generation, whether the
#: number counts TensorCores (two per v4 / v5p chip) rather than chips, and each size's slice.
_ACCELERATOR_TYPES = {
    "v4": ("v4", 2),
    "v5p": ("v5p", 2),
    "v5litepod": ("v5e", 1),
    "v5e": ("v5e", 1),
    "v6e": ("v6e", 1),
}
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_SHAPES_3D = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
}


def accelerator_topology(accelerator_type: str) -> str | None:
    """The topology name of a Cloud TPU accelerator type ("v5litepod-16" -> "v5e:4x4", "v4-32" ->
    "v4:2x2x4": its default slice shape), None when `accelerator_type` is not one of that form;
    `TopologyError` for a size that kind does not come in."""
    m = re.fullmatch(r"(v4|v5p|v5litepod|v5e|v6e)-(\d+)", accelerator_type.strip())
    if not m:
        return None
    generation, per_chip = _ACCELERATOR_TYPES[m.group(1)]
    chips, rest = divmod(int(m.group(2)), per_chip)
    shapes = _SHAPES_3D if _GENERATIONS[generation][0] == 3 else _SHAPES_2D
    if rest or chips not in shapes:
        sizes = ", ".join(f"{m.group(1)}-{c * per_chip}" for c in shapes)
        raise TopologyError(f"accelerator type {accelerator_type!r} is not a slice this knows: {sizes}")
    return f"{generation}:{'x'.join(map(str, shapes[chips]))}"


def parse_topology(name: str) -> TopologySpec:
    """`TopologySpec` of "v5e:2x4" and the like, or of a Cloud TPU accelerator type
    ("v5litepod-8", "v4-32": `accelerator_topology`); `TopologyError` naming the forms it takes."""
    name = accelerator_topology(name) or name
    m = re.fullmatch(r"(v\d+[ep]?):(\d+(?:x\d+)*)", name.strip())
    if not m or m.group(1) not in _GENERATIONS:
        known = ", ".join(sorted(_GENERATIONS))
        raise TopologyError(
            f"topology {name!r} is not GENERATION:AxB[xC] with GENERATION one of {known}, "
            "nor an accelerator type such as v5litepod-16 or v4-32"
        )
    generation, shape = m.group(1), tuple(int(x) for x in m.group(2).split("x"))
    axes = _GENERATIONS[generation][0]
    if len(shape) != axes or min(shape) < 1:
        raise TopologyError(
            f"topology {name!r}: {generation} slices have {axes} axes of chips, e.g. {_example(generation)}"
        )
    spec = TopologySpec(generation, shape)
    bounds = spec.host_bounds()
    if any(s % b for s, b in zip((*shape, 1)[:3], bounds)):
        host = "x".join(map(str, bounds[:axes]))
        raise TopologyError(f"topology {name!r}: a slice larger than one host is whole hosts of {host} chips")
    return spec


def topology_devices(name: str, num_slices: int = 1) -> list[Any]:
    """The devices of the TPU slice `name` (`num_slices` of them), described by libtpu on this
    host: for `jax.jit(...).lower(...).compile()` ahead of time, inside
    `platform.compile_target("tpu")`. `TopologyError` when the name does not parse or libtpu is
    not installed."""
    spec = parse_topology(name)
    if num_slices < 1:
        raise TopologyError(f"num_slices must be >= 1, got {num_slices}")
    import jax
    from jax.experimental import topologies

    jax.devices()  # this host's own backends first: the TPU plugin loaded below only describes
    library = compiler_path()
    if library is None:
        raise TopologyError(
            f"compiling for TPU topology {spec.name!r} needs XLA:TPU's compiler: pip install --no-deps "
            f"--target {os.path.join(sys.prefix, COMPILER_DIR)} libtpu==0.0.42.1"
        )
    os.environ["TPU_LIBRARY_PATH"] = library  # where JAX loads the plugin from
    _describe_no_tpu_host(spec)
    try:
        description = topologies.get_topology_desc(
            platform="tpu",
            topology_name=spec.name,
            chip_config_name=_GENERATIONS[spec.generation][2],
            chips_per_host_bounds=spec.host_bounds(),
            num_slices=num_slices,
            wrap=(False, False, False),
        )
    except Exception as e:  # libtpu's own refusal, one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TopologyError(f"libtpu cannot describe TPU topology {spec.name!r}: {first}") from e
    return list(description.devices)


def compiler_path() -> str | None:
    """libtpu.so, XLA:TPU's compiler: `$TPU_LIBRARY_PATH`, else an importable `libtpu` package
    (a TPU host's `jax[tpu]`), else the one installed beside this environment's site-packages
    (`<sys.prefix>/tpu-compiler`, where ./bazelw puts it: importable, JAX would load it in every
    process and try to open a TPU). None when there is none."""
    given = os.environ.get("TPU_LIBRARY_PATH")
    if given and os.path.isfile(given):
        return given
    spec = importlib.util.find_spec("libtpu")
    if spec is not None and spec.origin:
        found = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
        if os.path.isfile(found):
            return found
    beside = os.path.join(sys.prefix, COMPILER_DIR, "libtpu", "libtpu.so")
    return beside if os.path.isfile(beside) else None


def hbm_bytes(device: Any) -> int | None:
    """Device memory a program may use on `device`, by its kind (`HBM_BYTES`); None when unknown."""
    return HBM_BYTES.get(getattr(device, "device_kind", ""))


def process_count(devices: Sequence[Any]) -> int:
    """How many hosts the devices span (their distinct `process_index`)."""
    return len({d.process_index for d in devices})


def _describe_no_tpu_host(spec: TopologySpec) -> None:
    """libtpu asks the host's metadata for its own slice before describing another, and takes
    a lock meant for processes that own chips; on a host without a TPU both are told apart here
    (values already set are kept)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{spec.generation}-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _example(generation: str) -> str:
    return f"{generation}:2x2x1" if _GENERATIONS[generation][0] == 3 else f"{generation}:2x4"
