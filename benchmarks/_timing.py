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


def matmul_peak(repeats: int = 10, n: int = 2048, rounds: int = 3) -> float:
    """FLOP/s of a jitted float32 n x n matmul: the best of `rounds` medians of `repeats`
    (a shared VM's neighbours slow some rounds; a peak is what the machine can do), the MFU
    denominator on CPU."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    best = min(median_time(lambda: f(a, b).block_until_ready(), repeats, warmup=2) for _ in range(rounds))
    return 2 * n**3 / best


def verdict(ratio: float, target: float) -> str:
    """`holds` or `MISSED` for a speed ratio (higher is better) against its target."""
    return "holds" if ratio >= target else "MISSED"


def target_line(what: str, value: float, target: float, percent: bool = False) -> str:
    """`target <what> >= <target>: <value> (holds|MISSED)`; `percent` for MFU-like fractions."""
    fmt = (lambda x: f"{x:.1%}") if percent else (lambda x: f"{x:.2f}x")
    return f"target {what} >= {fmt(target)}: {fmt(value)} ({verdict(value, target)})"


def skinny_matmul_rate(rows: int, total_bytes: int, repeats: int = 7, emb: int = 512, cols: int = 1024) -> float:
    """Bytes/s of float32 weights a jitted chain of `[rows, emb] x [emb, cols]` matmuls reads
    (median), the chain holding `total_bytes` of weights: a decode step's rate of reading its
    weights with XLA:CPU's kernels, when every step multiplies `rows` tokens by every weight."""
    count = max(1, total_bytes // (4 * emb * cols))
    keys = jax.random.split(jax.random.PRNGKey(2), count)
    ws = [jax.random.normal(k, (emb, cols), jnp.float32) for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(3), (rows, emb), jnp.float32)
    f = jax.jit(lambda x, ws: [x @ w for w in ws])
    return count * 4 * emb * cols / median_time(lambda: jax.block_until_ready(f(x, ws)), repeats, warmup=2)


PEAK_FLOOR = "100 % of the matmul peak is"


DECODE_FLOOR = "prefill (T5: encoder) at the matmul peak + each step's weights at XLA's skinny-matmul rate is"


def decode_floor(prefill_flops: float, peak: float, steps: int, weight_bytes: int, rows: int) -> float:
    """Seconds of a decode whose prefill (or encoder) runs at `peak` and whose `steps` steps
    each read `weight_bytes` of weights for `rows` tokens at the in-run skinny-matmul rate:
    what XLA:CPU's kernels allow at best (`ceiling_line`'s floor, described by DECODE_FLOOR)."""
    return prefill_flops / peak + steps * weight_bytes / skinny_matmul_rate(rows, weight_bytes)


def ceiling_line(what: str, peer_s: float, floor_s: float, target: float, how: str = PEAK_FLOOR) -> str:
    """`ceiling <what>: <how> <floor> s -> at most <peer/floor>x (target ... reachable or not)`:
    the best ratio cairn could reach against the peer's measured time if it ran at `floor_s`."""
    best = peer_s / floor_s
    word = "within reach" if best >= target else "out of reach"
    return f"ceiling {what}: {how} {floor_s:.2f} s -> at most {best:.2f}x (target {target:.2f}x {word})"
