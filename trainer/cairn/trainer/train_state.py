"""The train state: params, optimizer state, step and RNG seed key."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class TrainState(flax.struct.PyTreeNode):
    """Everything a step reads and writes. `rng` is the run's raw uint32 seed key; the dropout
    key of step s is `fold_in(rng, s)`, so a resumed run draws the same keys. `compute`: with
    parameters offloaded to host memory (`TrainerConfig.offload_params`), their copy on the
    device in the dtype the model computes in (None for the others); derived from `params`, so
    not checkpointed (`cairn.trainer.param_offload`)."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    compute: Any = None

    @classmethod
    def create(cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array) -> TrainState:
        """Step 0 with the optimizer initialized on `params`."""
        return cls(params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32), rng=rng)
