"""Timing helpers shared by models_bench.py and _llama_bench.py: medians and the in-run matmul peak."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median seconds of `repeats` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_peak(repeats: int = 10, n: int = 2048) -> float:
    """FLOP/s of a jitted float32 n x n matmul (median): the MFU denominator on CPU."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    return 2 * n**3 / median_time(lambda: f(a, b).block_until_ready(), repeats, warmup=2)


def verdict(ratio: float, target: float) -> str:
    """`holds` or `MISSED` for a speed ratio (higher is better) against its target."""
    return "holds" if ratio >= target else "MISSED"


def target_line(what: str, value: float, target: float, percent: bool = False) -> str:
    """`target <what> >= <target>: <value> (holds|MISSED)`; `percent` for MFU-like fractions."""
    fmt = (lambda x: f"{x:.1%}") if percent else (lambda x: f"{x:.2f}x")
    return f"target {what} >= {fmt(target)}: {fmt(value)} ({verdict(value, target)})"
