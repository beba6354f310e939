"""XLA's GPU flags for training: the ones NVIDIA's JAX-Toolbox sets for MaxText on GPUs.

`set_gpu_xla_flags()` puts `GPU_XLA_FLAGS` into `XLA_FLAGS` when this process will run on an
NVIDIA GPU (JAX's CUDA plugin is installed and `JAX_PLATFORMS` does not leave the GPU out) and
the user has not set `XLA_FLAGS` (theirs are kept whole). XLA reads `XLA_FLAGS` once, when JAX
starts its first backend: call it before anything asks JAX for devices (importing jax is fine).
The train launcher calls it at start-up, and `benchmarks/_accel_rows.py` in its worker.

The flags (JAX-Toolbox's `rosetta/projects/maxtext/xla_flags/llama2-7b-1N8G.env` and its
GPU_performance.md): the latency-hiding scheduler; command buffers (CUDA graphs) off, as there;
collectives combined up to 1 GiB (all-reduce), 1 GiB / 8 GPUs (all-gather) and half that
(reduce-scatter), JAX-Toolbox's figures for one node of 8 GPUs, not combined by dimension;
all-gather, reduce-scatter and all-reduce pipelined out of scanned layers, and the scan's loop
double-buffered (FSDP's gathers overlap the previous layer); collectives on the
highest-priority stream. Each name is checked against the XLA of jaxlib 0.10.2, which refuses
a flag it does not know (`tests/partitioning/gpu_flags_test.py`). Left out: JAX-Toolbox's
`--xla_gpu_enable_triton_softmax_fusion=false` (gone from that XLA: it refuses it),
`--xla_gpu_graph_level=0` (the same; `--xla_gpu_enable_command_buffer=` replaced it),
`--xla_gpu_enable_triton_gemm=false` (a per-model kernel choice, not a scheduling one) and
`--xla_disable_hlo_passes=rematerialization` (without XLA's own rematerialization a step that
`plan_memory` fits could run out of memory).

Standard library only: nothing here starts JAX.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

_THRESHOLD_BYTES = 1 << 30  # JAX-Toolbox's THRESHOLD_BYTES
_GPUS = 8  # ... divided by its NUM_NODES * NUM_GPUS (one node of 8) for all-gather and reduce-scatter

GPU_XLA_FLAGS: tuple[str, ...] = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_highest_priority_async_stream=true",
    f"--xla_gpu_all_reduce_combine_threshold_bytes={_THRESHOLD_BYTES}",
    f"--xla_gpu_all_gather_combine_threshold_bytes={_THRESHOLD_BYTES // _GPUS}",
    f"--xla_gpu_reduce_scatter_combine_threshold_bytes={_THRESHOLD_BYTES // (_GPUS * 2)}",
    "--xla_gpu_enable_all_gather_combine_by_dim=false",
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
)

# The modules of JAX's CUDA plugins (jax-cuda12-plugin, requirements-cuda.lock; jax-cuda13-plugin).
CUDA_PLUGIN_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin")
_GPU_PLATFORM_NAMES = {"cuda", "gpu"}


def cuda_plugin_installed() -> bool:
    """Whether a JAX CUDA plugin is importable (looked up, not imported: no backend starts)."""
    return any(importlib.util.find_spec(name) is not None for name in CUDA_PLUGIN_MODULES)


def runs_on_gpu(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether JAX will start on an NVIDIA GPU here: a CUDA plugin is installed and
    `JAX_PLATFORMS` (unset or empty: every platform) names `cuda` or `gpu`."""
    environ = os.environ if environ is None else environ
    platforms = {p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if platforms and not platforms & _GPU_PLATFORM_NAMES:
        return False
    return cuda_plugin_installed()


def set_gpu_xla_flags(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Sets `XLA_FLAGS` to `GPU_XLA_FLAGS` in `environ` (default `os.environ`) when `runs_on_gpu`
    and `XLA_FLAGS` is not set. Returns "set" or "kept" (the user's `XLA_FLAGS`) on a GPU, with
    one log line saying which, and None elsewhere (nothing changed, nothing logged)."""
    environ = os.environ if environ is None else environ
    if not runs_on_gpu(environ):
        return None
    if "XLA_FLAGS" in environ:
        log.info("GPU: XLA_FLAGS kept as set (%r); cairn's GPU flags not added", environ["XLA_FLAGS"])
        return "kept"
    environ["XLA_FLAGS"] = " ".join(GPU_XLA_FLAGS)
    log.info("GPU: XLA_FLAGS set to JAX-Toolbox's training flags (cairn.partitioning.gpu_flags)")
    return "set"
