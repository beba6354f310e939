"""Model FLOPs utilization: the devices' peak FLOP/s (published bf16 peaks, or a CPU probe
measured once per machine and remembered)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from cairn import storage

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


def _machine() -> dict:
    """What the CPU probe's result depends on: the host, its CPU model, the cores this process
    may use, and the jaxlib that runs the matmul."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "host": platform.node(),
        "cpu": model or platform.processor() or platform.machine(),
        "cores": cores,
        "jaxlib": jax.lib.__version__,
    }


def peak_cache_path() -> str:
    """Where this machine's CPU probe result is kept: `$CAIRN_CACHE_HOME/cpu_peak_flops/<key>.json`
    (default `~/.cache/cairn/...`), the key a hash of `_machine()`."""
    home = os.environ.get("CAIRN_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "cairn")
    key = hashlib.sha256(json.dumps(_machine(), sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(home, "cpu_peak_flops", f"{key}.json")


def host_peak_flops() -> float:
    """`cpu_matmul_peak_flops()` of this machine, measured by the first process that asks and
    remembered in `peak_cache_path()` (written atomically; an unreadable file is measured
    again, an unwritable home only not remembered): a training run's start-up then skips the
    probe (about 0.5 CPU s), and its MFU is against the same peak as the last run's. Delete the
    file to measure again (after changing the machine's load or its CPU quota)."""
    path = peak_cache_path()
    try:
        return float(storage.read_json(path)["peak_flops"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = cpu_matmul_peak_flops()
    try:
        storage.write_json(path, {**_machine(), "peak_flops": value})
    except OSError:
        pass
    return value


def peak_flops(devices: Sequence[jax.Device] | None = None) -> float:
    """Total peak FLOP/s of `devices` (default: all): the published per-chip peak times the
    chip count, or on CPU this host's measured matmul probe (`host_peak_flops`) times the number
    of processes the devices belong to (one host each)."""
    devices = list(devices if devices is not None else jax.devices())
    if devices[0].platform == "cpu":
        return host_peak_flops() * len({d.process_index for d in devices})
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
