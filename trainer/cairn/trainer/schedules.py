"""Learning-rate schedules: t5x's factor strings, cosine and linear, with one warmup (`linear_warmup`)."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

Schedule = Callable[[jnp.ndarray], jnp.ndarray]

FACTORS = ("constant", "linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay", "decay_every", "cosine_decay")


def linear_warmup(step: jnp.ndarray, warmup_steps: int) -> jnp.ndarray:
    """The one warmup of every schedule here: `min(1, step / warmup_steps)` (1 without warmup,
    `warmup_steps <= 0`). t5x's `linear_warmup` factor; `cosine_schedule` and `linear_schedule`
    multiply their peak by it before `warmup_steps`."""
    if warmup_steps <= 0:
        return jnp.float32(1.0)
    return jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / warmup_steps)


def factor_schedule(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
    step_offset: int = 0,
    min_learning_rate: float = 1e-8,
) -> Schedule:
    """t5x's `create_learning_rate_scheduler`: the product of the named factors.

    `constant` = base_learning_rate; `linear_warmup` = min(1, step / warmup_steps);
    `rsqrt_decay` = 1 / sqrt(max(step, warmup_steps)); `rsqrt_normalized_decay` the same times
    sqrt(warmup_steps); `decay_every` = decay_factor ** (step // steps_per_decay); `cosine_decay`
    a cosine over `steps_per_cycle` after warmup. The result is at least `min_learning_rate`.
    """
    names = [n.strip() for n in factors.split("*")]
    unknown = [n for n in names if n not in FACTORS]
    if unknown:
        raise ValueError(f"unknown learning-rate factor(s) {unknown} in {factors!r}; allowed: {list(FACTORS)}")
    if "linear_warmup" in names or "rsqrt_decay" in names or "rsqrt_normalized_decay" in names:
        if warmup_steps <= 0:
            raise ValueError(f"warmup_steps must be > 0 with factors {factors!r}, got {warmup_steps}")

    def schedule(step):
        step = jnp.maximum(0, jnp.asarray(step, jnp.float32) - step_offset)
        ret = jnp.float32(1.0)
        for name in names:
            if name == "constant":
                ret *= base_learning_rate
            elif name == "linear_warmup":
                ret *= linear_warmup(step, warmup_steps)
            elif name == "rsqrt_decay":
                ret /= jnp.sqrt(jnp.maximum(step, warmup_steps))
            elif name == "rsqrt_normalized_decay":
                ret *= jnp.sqrt(float(warmup_steps))
                ret /= jnp.sqrt(jnp.maximum(step, warmup_steps))
            elif name == "decay_every":
                ret *= decay_factor ** (step // steps_per_decay)
            elif name == "cosine_decay":
                progress = jnp.maximum(0.0, (step - warmup_steps) / float(steps_per_cycle))
                ret *= jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0))))
        return jnp.maximum(ret, min_learning_rate).astype(jnp.float32)

    return schedule


def cosine_schedule(
    peak_learning_rate: float, total_steps: int, warmup_steps: int = 0, final_learning_rate: float = 0.0
) -> Schedule:
    """`linear_warmup` to `peak_learning_rate`, then a cosine down to `final_learning_rate` at
    `total_steps` (held after)."""
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        progress = jnp.clip((step - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
        cos = final_learning_rate + (peak_learning_rate - final_learning_rate) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
        warm = peak_learning_rate * linear_warmup(step, warmup_steps)
        return jnp.where(step < warmup_steps, warm, cos).astype(jnp.float32)

    return schedule


def linear_schedule(
    peak_learning_rate: float, total_steps: int, warmup_steps: int = 0, final_learning_rate: float = 0.0
) -> Schedule:
    """`linear_warmup` to `peak_learning_rate`, then linear decay to `final_learning_rate` at
    `total_steps` (held after)."""
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        progress = jnp.clip((step - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
        lin = peak_learning_rate + (final_learning_rate - peak_learning_rate) * progress
        warm = peak_learning_rate * linear_warmup(step, warmup_steps)
        return jnp.where(step < warmup_steps, warm, lin).astype(jnp.float32)

    return schedule
