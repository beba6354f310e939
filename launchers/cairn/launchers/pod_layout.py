"""Accelerator kinds for `//launchers:jobset`: GKE TPU slices and GPU node pools, and the host
and device layout a `--accelerator` / `--topology` / `--num_hosts` choice gives."""

from __future__ import annotations

import dataclasses
import math
import re

from cairn.launchers import validation


@dataclasses.dataclass(frozen=True)
class TpuKind:
    """A GKE TPU node pool kind (`cloud.google.com/gke-tpu-accelerator`)."""

    dims: int  # topology dimensions: 2x4 or 2x2x4
    single_host_chips: tuple  # chip counts of single-host slices
    chips_per_host: int  # chips per VM in multi-host slices


TPUS = {
    "tpu-v4-podslice": TpuKind(3, (4,), 4),
    "tpu-v5p-slice": TpuKind(3, (4,), 4),
    "tpu-v5-lite-podslice": TpuKind(2, (1, 4, 8), 4),
    "tpu-v6e-slice": TpuKind(2, (1, 4, 8), 4),
}
# GKE GPU node pools (`cloud.google.com/gke-accelerator`): the GPU counts a node can have.
GPUS = {
    "nvidia-h100-80gb": (1, 2, 4, 8),
    "nvidia-h100-mega-80gb": (8,),
    "nvidia-h200-141gb": (8,),
    "nvidia-b200": (8,),
    "nvidia-a100-80gb": (1, 2, 4, 8),
    "nvidia-tesla-a100": (1, 2, 4, 8, 16),
    "nvidia-l4": (1, 2, 4, 8),
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
}


class JobSetError(ValueError):
    """A flag of the renderer that cannot work: `flag` names it."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"--{flag}: {message}")
        self.flag = flag


@dataclasses.dataclass(frozen=True)
class Layout:
    """Hosts (pods) and accelerators per host of one slice or node pool."""

    accelerator: str
    hosts: int
    devices_per_host: int
    topology: str = ""  # TPU only

    @property
    def tpu(self) -> bool:
        return self.accelerator in TPUS

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host

    @property
    def node_selector(self) -> dict:
        if self.tpu:
            return {
                "cloud.google.com/gke-tpu-accelerator": self.accelerator,
                "cloud.google.com/gke-tpu-topology": self.topology,
            }
        return {"cloud.google.com/gke-accelerator": self.accelerator}

    @property
    def resource(self) -> str:
        return "google.com/tpu" if self.tpu else "nvidia.com/gpu"


def layout(
    accelerator: str, topology: str = "", num_hosts: int | None = None, gpus_per_host: int | None = None
) -> Layout:
    """The layout of a TPU slice (`topology`; `num_hosts`, if given, must match it) or of
    `num_hosts` GPU nodes (`gpus_per_host` defaults to the most the node kind has)."""
    if accelerator in TPUS:
        kind = TPUS[accelerator]
        if gpus_per_host is not None:
            raise JobSetError("gpus_per_host", f"is for GPU node pools, not {accelerator}")
        shape = f"{'x'.join(['N'] * kind.dims)}"
        if not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)*", topology or "") or topology.count("x") + 1 != kind.dims:
            raise JobSetError(
                "topology",
                f"{topology!r} is not a topology of {accelerator} ({shape}, e.g. "
                f"{'2x2x2' if kind.dims == 3 else '4x4'})",
            )
        chips = math.prod(int(n) for n in topology.split("x"))
        if chips in kind.single_host_chips:
            hosts = 1
        elif chips % kind.chips_per_host:
            raise JobSetError(
                "topology",
                f"{topology} ({chips} chips) of {accelerator}: single-host slices have "
                f"{' or '.join(map(str, kind.single_host_chips))} chips, multi-host ones "
                f"a multiple of {kind.chips_per_host}",
            )
        else:
            hosts = chips // kind.chips_per_host
        if num_hosts is not None and num_hosts != hosts:
            raise JobSetError(
                "num_hosts",
                f"{num_hosts} does not match topology {topology} of {accelerator}: "
                f"{chips} chips on {hosts} host(s) of {chips // hosts} chips",
            )
        return Layout(accelerator, hosts, chips // hosts, topology)
    if accelerator in GPUS:
        if topology:
            raise JobSetError("topology", f"is for TPU slices, not {accelerator} (use --num_hosts, --gpus_per_host)")
        counts = GPUS[accelerator]
        per_host = counts[-1] if gpus_per_host is None else gpus_per_host
        if per_host not in counts:
            raise JobSetError(
                "gpus_per_host", f"{per_host}: a {accelerator} node has {', '.join(map(str, counts))} GPUs"
            )
        hosts = 1 if num_hosts is None else num_hosts
        if hosts < 1:
            raise JobSetError("num_hosts", f"{hosts}: must be >= 1")
        return Layout(accelerator, hosts, per_host)
    known = sorted(TPUS) + sorted(GPUS)
    close = validation.close_names(accelerator or "", known)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise JobSetError("accelerator", f"unknown accelerator {accelerator!r}; {hint}known: {', '.join(known)}")
