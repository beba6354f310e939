"""Model FLOPs utilization against the devices' published bf16 peak FLOP/s; none on a CPU or an
unknown device kind (no peak is known there: MFU is left out, unless the caller gives a peak)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

log = logging.getLogger("cairn.trainer")

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
    this is the whole host's peak, not one virtual device's. What it measures depends on the
    machine's load: benchmarks measure it in the same run as what they compare with it."""
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


def peak_flops(devices: Sequence[jax.Device] | None = None) -> float | None:
    """Total peak FLOP/s of `devices` (default: all): the published per-chip peak times the chip
    count; None where no peak is known (a CPU, a device kind not in `PEAK_BF16_TFLOPS`), so that
    MFU is left out rather than computed against a wrong peak. A CPU's matmul speed depends on
    the machine's load and quota when it is measured (a probe once measured 3x too low under load
    and the run reported an MFU of 319 %); pass `TrainerConfig.peak_flops` (a peak you checked, e.g.
    `cpu_matmul_peak_flops()` on an idle machine) to get MFU there."""
    devices = list(devices if devices is not None else jax.devices())
    if devices[0].platform == "cpu":
        return None
    per_chip = published_peak_flops(devices[0].device_kind)
    if per_chip is None:
        _log_unknown(devices[0].device_kind)
        return None
    return per_chip * len(devices)


@functools.cache
def _log_unknown(kind: str) -> None:
    log.warning(
        "no published peak for device kind %r (known: %s): MFU is left out (trainer.peak_flops sets one)",
        kind,
        ", ".join(n for n, _ in PEAK_BF16_TFLOPS),
    )


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over peak FLOP/s."""
    return flops_per_token * tokens_per_second / peak
