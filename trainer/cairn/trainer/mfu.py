"""Model FLOPs utilization: the devices' peak FLOP/s (published bf16 peaks, or a CPU probe)."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

#: Published dense bf16 peaks per chip, TFLOP/s, matched against `device.device_kind`.
PEAK_BF16_TFLOPS = (
    ("TPU v5p", 459.0),
    ("TPU v5 lite", 197.0),
    ("TPU v5e", 197.0),
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


def published_peak_flops(device_kind: str) -> float | None:
    """The published bf16 peak FLOP/s of one chip of this kind, or None if not in the table."""
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in device_kind.lower():
            return tflops * 1e12
    return None


@functools.cache
def cpu_matmul_peak_flops(size: int = 1024, repeats: int = 5) -> float:
    """Measured float32 FLOP/s of a jitted `size`² matmul on this process's first CPU device,
    best of `repeats` (run once per process and cached). XLA's CPU matmul uses every core, so
    this is the whole host's peak, not one virtual device's."""
    device = jax.local_devices(backend="cpu")[0]  # jax.devices() lists other processes' too
    a = jax.device_put(jnp.ones((size, size), jnp.float32), device)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def peak_flops(devices: Sequence[jax.Device] | None = None) -> float:
    """Total peak FLOP/s of `devices` (default: all): the published per-chip peak times the
    chip count, or on CPU this host's measured matmul probe times the number of processes the
    devices belong to (one host each)."""
    devices = list(devices if devices is not None else jax.devices())
    if devices[0].platform == "cpu":
        return cpu_matmul_peak_flops() * len({d.process_index for d in devices})
    per_chip = published_peak_flops(devices[0].device_kind)
    if per_chip is None:
        raise ValueError(
            f"no published peak for device kind {devices[0].device_kind!r}; known: "
            f"{[n for n, _ in PEAK_BF16_TFLOPS]}. Pass peak_flops explicitly."
        )
    return per_chip * len(devices)


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over peak FLOP/s."""
    return flops_per_token * tokens_per_second / peak
