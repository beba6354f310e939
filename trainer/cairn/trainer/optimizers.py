"""Optimizers through optax: Adafactor with T5's settings (factored by optax's heuristic or by
logical axis names, `adafactor_axes`), AdamW, global-norm clipping, the weight-decay mask, frozen
parameters and per-group learning rates (`param_groups`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cairn.partitioning.platform import platform_variant
from cairn.trainer import param_groups
from cairn.trainer.adafactor_axes import adafactor_axes, factor_rules, logical_factor_map
from cairn.trainer.param_groups import DEFAULT_NO_DECAY, ParamGroup
from cairn.trainer.schedules import Schedule

OPTIMIZERS = ("adafactor", "adamw")
# How Adafactor picks the dimensions it factors: optax's heuristic (the two largest) or t5x's
# rules on the parameters' logical axis names (`adafactor_axes`).
FACTORINGS = ("heuristic", "logical")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer, with what hyperparameters. Defaults are T5's Adafactor.

    `clip_grad_norm` (None: off) clips the global gradient norm before the update.
    `weight_decay` applies to AdamW (decoupled) and Adafactor (`weight_decay_rate`), except to
    parameters whose path matches a `no_decay` regex (default: norm scales, biases, embeddings).
    `factoring="logical"`: Adafactor factored by the parameters' logical axes (t5x), with
    `factor_rules` (axis name -> row/column/batch/none) over `STANDARD_FACTOR_RULES`.
    `freeze`: regexes of parameters that never change; `groups`: `ParamGroup`s (regex, learning
    rate scale), each with its own optimizer (`optax.multi_transform`; the first match wins).
    """

    name: str = "adafactor"
    # Adafactor (T5): factored second moments, decay 0.8, update clipping 1.0, no momentum.
    decay_rate: float = 0.8
    clipping_threshold: float | None = 1.0
    multiply_by_parameter_scale: bool = True
    factored: bool = True
    min_dim_size_to_factor: int = 128
    momentum: float | None = None
    factoring: str = "heuristic"
    factor_rules: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # AdamW.
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # Both.
    clip_grad_norm: float | None = None
    no_decay: tuple[str, ...] = DEFAULT_NO_DECAY
    freeze: tuple[str, ...] = ()
    groups: tuple[ParamGroup, ...] = ()

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"OptimizerConfig.name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ValueError(f"OptimizerConfig.clip_grad_norm must be > 0 or None, got {self.clip_grad_norm}")
        if self.factoring not in FACTORINGS:
            raise ValueError(f"OptimizerConfig.factoring must be one of {FACTORINGS}, got {self.factoring!r}")
        factor_rules(self.factor_rules)
        for pattern in (*self.no_decay, *self.freeze):
            param_groups.compile_pattern(pattern)

    @property
    def needs_param_axes(self) -> bool:
        """Whether `make_optimizer` needs the parameters' logical axes (`param_axes`)."""
        return self.name == "adafactor" and self.factoring == "logical"


def _factored_dims(shape, factored: bool, min_dim_size_to_factor: int):
    """optax's rule: the two largest axes `(d1, d0)` (d0 the largest), if both are large enough."""
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


def _mean(x, axis: int):
    """`jnp.mean(x, axis)`; over the rows of a wide matrix, as a vector-matrix product.

    XLA:CPU reduces a `[512, 32128]` matrix over its rows (the T5 logits kernel's column
    statistics) about 3x slower than it multiplies it by a vector of ones (jax 0.10.2).
    """
    if x.ndim == 2 and axis == 0 and x.shape[1] > x.shape[0]:
        return jnp.dot(jnp.ones((x.shape[0],), x.dtype), x) / x.shape[0]
    return jnp.mean(x, axis=axis)


# Which factored-RMS code Adafactor runs, when not given: "auto" (the CPU variant when
# `platform.backend()` is "cpu" as the optimizer is built, `optax.scale_by_factored_rms` on GPU
# and TPU), "cpu" or "optax" (either one on any platform: tests compare them).
FACTORED_RMS = "auto"
FACTORED_RMS_CHOICES = ("auto", "cpu", "optax")


def factored_rms_variant(variant: str | None = None) -> str:
    """ "cpu" or "optax": `variant`, else the module's `FACTORED_RMS`, with "auto" decided by
    `platform.backend()` (deterministic for a process: its default platform or compile target)."""
    setting = FACTORED_RMS if variant is None else variant
    return platform_variant(setting, FACTORED_RMS_CHOICES, "factored RMS variant", "optax")


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: float = 1e-30,
    *,
    variant: str | None = None,
) -> optax.GradientTransformation:
    """`optax.scale_by_factored_rms`, or on CPU the same state and formulas written to run faster
    there (`variant`: "auto" (default, see `FACTORED_RMS`), "cpu" or "optax").

    The CPU variant differs at float32 rounding level only: `lax.rsqrt` instead of `x ** -0.5`
    (XLA:CPU evaluates the power elementwise through exp/log), and `_mean` for row means of wide
    matrices. Its state is optax's `FactoredState` (its `init`), so checkpoints and sharding
    rules are the same for both and a run may resume with the other variant.
    """
    reference = optax.scale_by_factored_rms(factored, decay_rate, step_offset, min_dim_size_to_factor, epsilon)
    if factored_rms_variant(variant) == "optax":
        return reference

    def update_fn(grads, state, params):
        if params is None:
            raise ValueError("scale_by_factored_rms needs params")
        t = jnp.array(state.count - step_offset + 1, jnp.float32)
        beta2 = 1.0 - t ** (-decay_rate)

        def one(grad, v_row, v_col, v, param):
            dtype = param.dtype
            dims = _factored_dims(param.shape, factored, min_dim_size_to_factor)
            grad_sqr = jnp.square(grad) + epsilon
            if dims is None:
                new_v = (beta2 * v + (1.0 - beta2) * grad_sqr).astype(dtype)
                return grad * jax.lax.rsqrt(new_v), jnp.zeros((1,), dtype), jnp.zeros((1,), dtype), new_v
            d1, d0 = dims
            new_v_row = (beta2 * v_row + (1.0 - beta2) * _mean(grad_sqr, d0)).astype(dtype)
            new_v_col = (beta2 * v_col + (1.0 - beta2) * _mean(grad_sqr, d1)).astype(dtype)
            reduced_d1 = d1 - 1 if d1 > d0 else d1
            row_col_mean = jnp.mean(new_v_row, axis=reduced_d1, keepdims=True)
            row_factor = jax.lax.rsqrt(new_v_row / row_col_mean)
            col_factor = jax.lax.rsqrt(new_v_col)
            update = grad * jnp.expand_dims(row_factor, axis=d0) * jnp.expand_dims(col_factor, axis=d1)
            return update, new_v_row, new_v_col, jnp.zeros((1,), dtype)

        out = jax.tree.map(one, grads, state.v_row, state.v_col, state.v, params)
        treedef = jax.tree.structure(grads)
        parts = [treedef.unflatten(x) for x in zip(*treedef.flatten_up_to(out))] if treedef.num_leaves else [grads] * 4
        return parts[0], optax.FactoredState(
            count=optax.safe_increment(state.count), v_row=parts[1], v_col=parts[2], v=parts[3]
        )

    return optax.GradientTransformation(reference.init, update_fn)


def adafactor(
    learning_rate,
    min_dim_size_to_factor: int = 128,
    decay_rate: float = 0.8,
    decay_offset: int = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: float | None = 1.0,
    momentum: float | None = None,
    dtype_momentum=jnp.float32,
    weight_decay_rate: float | None = None,
    eps: float = 1e-30,
    factored: bool = True,
    weight_decay_mask=None,
    factored_rms: str | None = None,
) -> optax.GradientTransformation:
    """`optax.adafactor`, the same chain and state, with `scale_by_factored_rms` above (its
    CPU variant on CPU; `factored_rms` forces "cpu" or "optax")."""
    tx = [scale_by_factored_rms(factored, decay_rate, decay_offset, min_dim_size_to_factor, eps, variant=factored_rms)]
    if clipping_threshold is not None:
        tx.append(optax.clip_by_block_rms(clipping_threshold))
    if learning_rate is not None:
        tx.append(optax.scale_by_learning_rate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        tx.append(optax.scale_by_param_block_rms())
    if momentum is not None:
        tx.append(optax.ema(momentum, debias=False, accumulator_dtype=dtype_momentum))
    if weight_decay_rate is not None:
        tx.append(optax.add_decayed_weights(weight_decay_rate, mask=weight_decay_mask))
    tx.append(optax.scale(-1))
    return optax.chain(*tx)


def adafactor_t5(learning_rate: float | Schedule, **overrides) -> optax.GradientTransformation:
    """Adafactor with T5's settings (t5x `adafactor.Adafactor` defaults): factored
    second moments for dims >= 128, decay rate 0.8, update clipping at RMS 1.0, no momentum,
    updates scaled by the parameter's RMS (floored at 1e-3), epsilon 1e-30.

    optax's `adafactor` chain and state; on CPU with the CPU variant of `scale_by_factored_rms`
    above (equal up to float32 rounding, ~1.5x faster on CPU for T5.1.1-small). `overrides` go
    to `adafactor` (e.g. `factored_rms="optax"`).
    """
    kwargs: dict[str, Any] = dict(
        min_dim_size_to_factor=128,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=True,
        clipping_threshold=1.0,
        momentum=None,
        eps=1e-30,
        factored=True,
    )
    kwargs.update(overrides)
    return adafactor(learning_rate, **kwargs)


def make_optimizer(
    config: OptimizerConfig, schedule: float | Schedule, param_axes: Any = None
) -> optax.GradientTransformation:
    """The optax transformation for `config` with learning rate `schedule` (a float or a
    function of the step): frozen gradients zeroed, then global-norm clipping when configured,
    then the optimizer (one per group with `groups`). `param_axes`: the params' logical specs,
    needed when `config.needs_param_axes`."""
    if config.needs_param_axes and param_axes is None:
        raise ValueError("OptimizerConfig.factoring='logical' needs the parameters' logical axes (param_axes)")
    factor_map = logical_factor_map(param_axes, factor_rules(config.factor_rules)) if config.needs_param_axes else None
    mask = param_groups.decay_mask(config.no_decay) if config.no_decay else None

    def make(scale: float) -> optax.GradientTransformation:
        lr = param_groups.scaled(schedule, scale)
        if config.name == "adamw":
            return optax.adamw(
                lr, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay, mask=mask
            )
        options: dict[str, Any] = dict(
            decay_rate=config.decay_rate,
            clipping_threshold=config.clipping_threshold,
            multiply_by_parameter_scale=config.multiply_by_parameter_scale,
            factored=config.factored,
            min_dim_size_to_factor=config.min_dim_size_to_factor,
            momentum=config.momentum,
            weight_decay_rate=config.weight_decay or None,
            weight_decay_mask=mask,
        )
        if factor_map is not None:
            return adafactor_axes(lr, factor_map, **options)
        return adafactor_t5(lr, **options)

    tx = param_groups.grouped(make, config.freeze, config.groups)
    frozen = param_groups.matches_any(config.freeze) if config.freeze else None
    if config.clip_grad_norm is not None:
        tx = optax.chain(clip_by_global_norm(config.clip_grad_norm, frozen), tx)
    if frozen is not None:  # frozen gradients do not count in the global norm
        tx = optax.chain(optax.masked(optax.set_to_zero(), lambda p: param_groups.path_mask(p, frozen)), tx)
    return tx


def clip_by_global_norm(
    max_norm: float, frozen: Callable[[str], bool] | None = None
) -> optax.GradientTransformationExtraArgs:
    """`optax.clip_by_global_norm` (the same arithmetic, so the same bits) whose norm can come
    from the whole gradient tree when the update sees part of it: the extra argument
    `offload_full_updates` (`offload_update.grouped_update`), with the parameters that
    `frozen(path)` names counted as zeros, as the chain's freezing makes them."""

    def update(updates, state, params=None, *, offload_full_updates=None, **extra_args):
        del params, extra_args
        whole = updates
        if offload_full_updates is not None:
            whole = offload_full_updates
            if frozen is not None:
                mask = param_groups.path_mask(whole, frozen)
                whole = jax.tree.map(lambda g, m: jnp.zeros_like(g) if m else g, whole, mask)
        g_norm = optax.tree.norm(whole)
        trigger = jnp.squeeze(g_norm < max_norm)

        def clip(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def as_schedule(learning_rate: float | Callable) -> Callable:
    """A function of the step, whether given a float or a schedule."""
    if callable(learning_rate):
        return learning_rate
    return lambda step: learning_rate
