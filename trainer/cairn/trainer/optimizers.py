"""Optimizers through optax: Adafactor with T5's settings, AdamW, global-norm clipping."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

import optax

from cairn.trainer.schedules import Schedule

OPTIMIZERS = ("adafactor", "adamw")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer, with what hyperparameters. Defaults are T5's Adafactor.

    `clip_grad_norm` (None: off) clips the global gradient norm before the update.
    `weight_decay` applies to AdamW (decoupled) and Adafactor (`weight_decay_rate`).
    """

    name: str = "adafactor"
    # Adafactor (T5): factored second moments, decay 0.8, update clipping 1.0, no momentum.
    decay_rate: float = 0.8
    clipping_threshold: Optional[float] = 1.0
    multiply_by_parameter_scale: bool = True
    factored: bool = True
    min_dim_size_to_factor: int = 128
    momentum: Optional[float] = None
    # AdamW.
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # Both.
    clip_grad_norm: Optional[float] = None

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"OptimizerConfig.name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ValueError(f"OptimizerConfig.clip_grad_norm must be > 0 or None, got {self.clip_grad_norm}")


def adafactor_t5(learning_rate: Union[float, Schedule], **overrides) -> optax.GradientTransformation:
    """optax's Adafactor with T5's settings (t5x `adafactor.Adafactor` defaults): factored
    second moments for dims >= 128, decay rate 0.8, update clipping at RMS 1.0, no momentum,
    updates scaled by the parameter's RMS (floored at 1e-3), epsilon 1e-30."""
    kwargs = dict(min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0,
                  multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None,
                  eps=1e-30, factored=True)
    kwargs.update(overrides)
    return optax.adafactor(learning_rate, **kwargs)


def make_optimizer(config: OptimizerConfig, schedule: Union[float, Schedule]) -> optax.GradientTransformation:
    """The optax transformation for `config` with learning rate `schedule` (a float or a
    function of the step), preceded by global-norm clipping when configured."""
    if config.name == "adafactor":
        tx = adafactor_t5(schedule, decay_rate=config.decay_rate, clipping_threshold=config.clipping_threshold,
                          multiply_by_parameter_scale=config.multiply_by_parameter_scale,
                          factored=config.factored, min_dim_size_to_factor=config.min_dim_size_to_factor,
                          momentum=config.momentum, weight_decay_rate=config.weight_decay or None)
    else:
        tx = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    if config.clip_grad_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(config.clip_grad_norm), tx)
    return tx


def as_schedule(learning_rate: Union[float, Callable]) -> Callable:
    """A function of the step, whether given a float or a schedule."""
    if callable(learning_rate):
        return learning_rate
    return lambda step: learning_rate
